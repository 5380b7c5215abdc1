"""`make gpu-check`: what a machine with a GPU must show, in one command, written to `results/gpu/<gpu name>/`.

1. `lossless.log`, `lossless.xml`: the lossless tests on CUDA in float32 (every method and its variants against
   vanilla token for token, vanilla against `generate`, tree logits against causal runs), the same pytest tests
   as on the CPU with `SPECDEC_TEST_DEVICE=cuda`.
2. `runs/`, `report.md`, `report.csv`, `lossless.csv`: every training-free method (and the trained ones whose draft
   is committed) on a float16 slice of Spec-Bench (the first question of each subtask, 128 new tokens, 1 warm-up).
   In float16 a tree forward and a one-token forward may round differently and flip a near-tie, so the match rate
   is reported, not required; `first_differences.csv` gives, where an answer first differs from vanilla's, the
   top-2 logit margin of a plain causal float16 forward at that position: near-ties have a small one.
3. `paired/<target>/`: for each target of conf/checkpoints.yaml whose weights are in the hub's local cache (e.g.
   after `make fetch-checkpoints`), vanilla and every method whose released checkpoint is cached too, on the same
   float16 slice, interleaved, with its report: the released checkpoints loaded and run end to end on the GPU.
4. `engine/`: forward latency against new tokens (the latency curve; `run.latency_curve=` replays it) and our
   vanilla loop against `generate`.
5. `summary.md`: all of it on one page, with each step's time.

It needs no network once the embedded model is converted in the cache and the question sets are under data/ (an
earlier `make bench` or `make test`, or an offline bundle's install.sh): hub access is switched off for everything
it runs. Sized for under 10 minutes on one H200-class GPU, an estimate (not yet run on one): a step of the 135M
model is bound by kernel launches, roughly 5-8 ms (30 layers of about a dozen kernels each, plus the method's
Python), so the lossless tests' few tens of thousands of steps take 2-4 minutes, the float16 slice (about 11,000
tokens at 1.5-2 tokens a step) 1-2, the latency curve and the generate() comparison about 1, and each of the five
processes' start-up (imports, model load) about 15 s. Without CUDA it stops at once with one line (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from evaluation.catalog import bench_settings
from evaluation.files import write_text

ROOT = Path(__file__).resolve().parents[2]
# The lossless tests: every method's `assert_lossless` tests, the engine's exactness checks.
LOSSLESS_FILES = ["test_engine.py", "test_budget.py", "test_pld.py", "test_logitspec.py", "test_lookahead.py",
                  "test_rest.py", "test_recycling.py", "test_sam.py", "test_gumiho.py", "test_sampling.py"]
LOSSLESS_TESTS = ("lossless or vanilla_equals_transformers or causal_runs or oracle or eos_in_the_middle or never_exceeded"
                  " or tends_to_greedy")
# REST's datastore for the slice: the first N ShareGPT conversations (the full one takes about 3 minutes to build).
REST_CONVERSATIONS = 2000


DIFFERENCE_COLUMNS = ["method_label", "question_id", "turn", "position", "vanilla_token", "method_token",
                      "top2_margin", "method_token_gap", "causal_argmax_is_vanilla"]


def gpu_slug(name: str) -> str:
    """A folder name for a GPU: `NVIDIA H200` -> `NVIDIA-H200`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "gpu"


def slice_methods() -> list[str]:
    """Every method config, vanilla first; the trained-draft ones only with a committed draft (as `make bench`)."""
    return bench_settings("smollm2-135m")


def cached_pairings() -> dict[str, list[str]]:
    """For each target of conf/checkpoints.yaml whose weights are in the hub's local cache: vanilla and every method
    whose paired checkpoint is cached too, as interleave cells (a short float16 slice of each in `make gpu-check`)."""
    from evaluation.catalog import bench_plan, config_method, import_class
    from evaluation.checkpoints import targets
    from evaluation.run.preflight import in_hub_cache
    from evaluation.tools.fetch_checkpoints import target_hub_id

    found = {}
    for target in targets():
        hub_id = target_hub_id(target)
        if not hub_id or not in_hub_cache(hub_id):
            continue
        cells = []
        for config_name in bench_plan(target)[0][1:]:
            cls = import_class(config_method(config_name).target)
            source = cls.trained_source(cls.Config(), target)  # what it loads with its defaults
            if source is not None and in_hub_cache(source):
                cells.append(f"method={config_name}")
        if cells:
            found[target] = ["method=vanilla", *cells]
    return found


class Steps:
    """Runs the steps, logs each one's output and time, and remembers which failed."""

    def __init__(self, out: Path, env: dict):
        self.out, self.env = out, env
        self.seconds: dict[str, float] = {}
        self.failed: list[str] = []

    def run(self, name: str, command: list[str], log: str, **env: str) -> bool:
        print(f"== {name}: {' '.join(command)}", flush=True)
        start = time.perf_counter()
        with open(self.out / log, "w") as handle:
            process = subprocess.Popen(command, cwd=ROOT, env={**self.env, **env}, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
            for line in process.stdout:
                sys.stdout.write(line)
                handle.write(line)
            ok = process.wait() == 0
        self.seconds[name] = time.perf_counter() - start
        if not ok:
            self.failed.append(name)
        return ok


def first_differences(lm, runs_dir: Path, questions: dict) -> pd.DataFrame:
    """For every answer whose ids differ from vanilla's (same comparison), the first differing position and the
    top-2 logit margin there: a plain causal forward of `lm` over the prompt of that turn (asked after vanilla's
    own earlier answers, which both share) plus vanilla's tokens before the position."""
    from evaluation.tools.half_precision import token_margins
    from evaluation.report.load import first_difference
    from evaluation.templates import build_prompt_ids

    runs: dict[str, dict[str, list]] = {}
    for manifest_path in sorted(runs_dir.glob("**/manifest.json")):
        manifest = json.loads(manifest_path.read_text())
        records = [json.loads(line) for line in (manifest_path.parent / "answers.jsonl").read_text().splitlines()]
        ok = {r["question_id"]: r["choices"][0] for r in records if r.get("status", "ok") == "ok"}
        runs.setdefault(manifest["comparison_key"], {})[manifest["method_label"]] = ok
    rows = []
    for comparison in runs.values():
        vanilla = comparison.get("vanilla", {})
        for label, answers in comparison.items():
            if label == "vanilla":
                continue
            for qid, choice in answers.items():
                if qid not in vanilla:
                    continue
                reference = vanilla[qid]
                diff = first_difference(choice["token_ids"], reference["token_ids"])
                if diff is None:
                    continue
                turn, position = diff
                row = {"method_label": label, "question_id": qid, "turn": turn, "position": position}
                ours, theirs = choice["token_ids"][turn], reference["token_ids"][turn]
                if position < min(len(ours), len(theirs)):
                    question = questions[qid]
                    history = list(zip(question.turns[:turn], reference["turns"][:turn]))
                    ids = build_prompt_ids(lm.tokenizer, lm.chat_template, history, question.turns[turn])
                    row.update(token_margins(lm, ids + theirs[:position], theirs[position], ours[position]))
                rows.append(row)
    return pd.DataFrame(rows, columns=DIFFERENCE_COLUMNS)


def summary(out: Path, gpu: str, steps: Steps) -> str:
    lines = [f"# GPU check: {gpu}", "",
             f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
             f"{time.strftime('%Y-%m-%d %H:%M')}; step times: "
             + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in steps.seconds.items()), ""]
    if steps.failed:
        lines += [f"**Failed steps: {', '.join(steps.failed)}** (see their logs here)", ""]
    junit = out / "lossless.xml"
    if junit.is_file():
        text = junit.read_text()
        tests, failures, errors, skipped = (int(m.group(1)) if (m := re.search(fr'{key}="(\d+)"', text)) else 0
                                            for key in ("tests", "failures", "errors", "skipped"))
        lines += [f"## Lossless tests, float32 on CUDA: {tests - failures - errors - skipped} of {tests} passed "
                  f"({failures} failed, {errors} errors, {skipped} skipped)", ""]
    if (out / "lossless.csv").is_file():
        table = pd.read_csv(out / "lossless.csv")
        if not table.empty:
            rate = table.groupby("method_label").equal.agg(["mean", "size"]).rename(
                columns={"mean": "match rate", "size": "questions"})
            lines += ["## Float16 slice: answers equal to vanilla's", "", rate.to_markdown(floatfmt=".2f"), ""]
    if (out / "first_differences.csv").is_file():
        table = pd.read_csv(out / "first_differences.csv")
        lines += ["## Where float16 answers first differ: top-2 logit margin of the causal forward", "",
                  table.to_markdown(index=False, floatfmt=".3f") if not table.empty else "(none differ)", ""]
    if (out / "report.csv").is_file():
        report = pd.read_csv(out / "report.csv").query("subtask == 'overall'")
        lines += ["## Float16 slice: overall speedup and MAT", "",
                  report[["method_label", "tokens_per_s", "speedup", "mat"]].to_markdown(index=False, floatfmt=".2f"),
                  ""]
    latency = out / "engine" / "forward_latency.csv"
    if latency.is_file():
        table = pd.read_csv(latency)
        lines += ["## Forward latency against new tokens (float16)", "",
                  table.drop(columns=[c for c in ("model", "device", "dtype") if c in table]).to_markdown(
                      index=False, floatfmt=".2f"), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/gpu", help="the GPU's folder goes under this one")
    parser.add_argument("--questions", type=int, default=1, help="questions per subtask of the float16 slice")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--methods", default=None, help="comma-separated method configs (default: all)")
    parser.add_argument("--skip-tests", action="store_true", help="leave out the lossless tests")
    # A developer's dry run of the script's plumbing on a CPU (nothing it writes says anything about a GPU).
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    parser.add_argument("--tests", default=LOSSLESS_TESTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"error: make gpu-check needs a CUDA GPU, and torch {torch.__version__} sees none on this machine "
              "(torch.cuda.is_available() is False)", file=sys.stderr)
        sys.exit(2)
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else f"dry run on {args.device}"
    out = Path(args.out) / gpu_slug(gpu)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    steps = Steps(out, env)
    python = sys.executable
    dtype = "float16" if args.device == "cuda" else "float32"

    steps.run("data", [python, "-m", "evaluation.tools.data"], "data.log")
    if not args.skip_tests:
        steps.run("lossless tests", [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", args.tests,
                                     f"--junitxml={out / 'lossless.xml'}",
                                     *[f"tests/{name}" for name in LOSSLESS_FILES]],
                  "lossless.log", SPECDEC_TEST_DEVICE=args.device)
    methods = args.methods.split(",") if args.methods else slice_methods()
    common = [f"model.dtype={dtype}", f"run.device={args.device}", f"bench.questions_per_subtask={args.questions}",
              f"bench.max_new_tokens={args.max_new_tokens}", "bench.warmup=1", f"run.results_dir={out / 'runs'}",
              "run.report=false", "run.progress=false"]
    plain = [m for m in methods if m != "rest"]
    steps.run("float16 slice", [python, "run.py", "-m", f"method={','.join(plain)}", *common,
                                f"hydra.sweep.dir={out / 'hydra'}"], "slice.log")
    if "rest" in methods:
        steps.run("float16 slice (rest)", [python, "run.py", "method=rest",
                                           f"method.max_conversations={REST_CONVERSATIONS}", *common], "slice_rest.log")
    steps.run("report", [python, "-m", "evaluation.report", "--results", str(out / "runs"), "--out", str(out)],
              "report.log")
    try:
        from hydra import compose, initialize_config_dir

        from evaluation.run.config import register_configs
        from evaluation.models import load_model
        from evaluation.questions import load_questions

        register_configs()
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            cfg = compose("config", overrides=[f"model.dtype={dtype}", f"run.device={args.device}"])
        lm = load_model(cfg.model, args.device)
        questions = {q.question_id: q for q in load_questions(Path(cfg.bench.question_file))}
        write_text(out / "first_differences.csv",
                   first_differences(lm, out / "runs", questions).to_csv(index=False, float_format="%.4g"))
    except Exception as exc:  # noqa: BLE001 - reported with the other steps; the rest still runs
        print(f"first differences failed: {type(exc).__name__}: {exc}", flush=True)
        steps.failed.append("first differences")
    for model, cells in cached_pairings().items():  # released checkpoints already in the hub's cache
        folder = out / "paired" / model
        steps.run(f"paired checkpoints ({model})",
                  [python, "-m", "evaluation.run.interleave", *cells, "--", f"model={model}", *common[:5],
                   f"run.results_dir={folder / 'runs'}", "run.report=false"], f"paired_{model}.log")
        steps.run(f"report ({model})", [python, "-m", "evaluation.report", "--results", str(folder / "runs"),
                                        "--out", str(folder)], f"paired_{model}_report.log")
    steps.run("engine", [python, "-m", "evaluation.tools.bench_engine", f"model.dtype={dtype}", f"run.device={args.device}",
                         "--out", str(out / "engine")], "engine.log")

    write_text(out / "summary.md", summary(out, gpu, steps))
    print(f"\nWritten: {out}/summary.md (and the logs, runs, report and engine tables beside it)")
    if steps.failed:
        print(f"error: failed steps: {', '.join(steps.failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    from evaluation.versions import require_supported_environment

    require_supported_environment()
    main()
