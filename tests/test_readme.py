"""The README's commands exist: every `make` target and variable it names is the Makefile's, every
`python run.py` override composes, every `python -m` module is there, and the cheap ones run as written."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import ROOT, compose_config, question_file

README = ROOT / "README.md"
DOCS = [README, ROOT / "docs" / "gpu-and-clusters.md"]


def code_commands(path) -> list[str]:
    """The commands of the page: lines of its bash code blocks and inline `make ...`/`python ...` spans, with
    comments dropped and continuation lines joined."""
    text = path.read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    commands += re.findall(r"`((?:make|python) [^`]+)`", text)
    return commands


def makefile_names() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", text, flags=re.M))
    variables = set(re.findall(r"^([A-Z_]+)\s*[:?]?=", text, flags=re.M))
    return targets, variables


def test_every_make_command_names_a_target_and_its_variables():
    targets, variables = makefile_names()
    seen = 0
    for path in DOCS:
        for command in code_commands(path):
            if not command.startswith("make "):
                continue
            words = shlex.split(command.split("&&")[0])[1:]
            named = [w for w in words if "=" not in w and not w.startswith("-")]
            assigned = [w.split("=", 1)[0] for w in words if "=" in w]
            assert named and all(t in targets for t in named), f"{path.name}: {command}"
            assert all(v in variables for v in assigned), f"{path.name}: {command} sets an unknown variable"
            seen += 1
    assert seen >= 10


def test_every_run_py_override_composes_and_every_module_exists():
    composed = modules = 0
    for path in DOCS:
        for command in code_commands(path):
            words = shlex.split(command)
            if words[:2] == ["python", "run.py"]:
                overrides = [w.split(",")[0] if "=" in w and not w.startswith(("bench.subtasks", "model.device_map"))
                             else w for w in words[2:] if w != "-m" and not w.startswith(("hydra/launcher", "hydra.launcher"))]
                overrides = [o for o in overrides if not o.startswith("...")]
                compose_config(*overrides)
                composed += 1
            elif words[:2] == ["python", "-m"]:
                assert importlib.util.find_spec(words[2]) is not None, f"{path.name}: no module {words[2]}"
                modules += 1
    assert composed >= 4 and modules >= 2


def test_make_bench_with_a_short_model_name_resolves():
    out = subprocess.run(["make", "--no-print-directory", "-n", "bench", "MODEL=vicuna-7b", "PY=python3"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "evaluation.run.interleave" in out and "model=vicuna-7b" in out
    cfg = compose_config("model=vicuna-7b")
    assert cfg.model.name == "vicuna-7b-v1.3" and cfg.model.hf_id == "lmsys/vicuna-7b-v1.3"
    done = subprocess.run([sys.executable, "-m", "evaluation.catalog", "bench-settings", "vicuna-7b"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    methods = done.stdout.strip().split(",")
    # Every leaderboard row with a released Vicuna-7B checkpoint (conf/checkpoints.yaml), EAGLE-3 left out with why
    assert methods[0] == "vanilla" and {"logitspec", "eagle", "eagle2", "medusa", "hydra", "gumiho", "sps"} <= set(methods)
    assert "eagle3" not in methods
    assert done.stderr.splitlines() == [
        "leaves out eagle3: no EAGLE-3 draft committed or released for vicuna-7b-v1.3 (train one: "
        "make train FAMILY=eagle3 MODEL=vicuna-7b-v1.3; or method.draft=<hub id or folder>)"]


def test_make_help_gives_every_target_a_duration():
    out = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    targets, _ = makefile_names()
    listed = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert listed == targets - {".venv", "results"} - {t for t in targets if t.startswith(".")}
    assert all(re.search(r"\[[^]]+\]", line) for line in out.splitlines() if line.strip())


def test_the_readme_error_example_is_what_a_bad_option_prints():
    [example] = re.findall(r"^error: .*$", README.read_text(), flags=re.M)
    option = re.match(r"error: bad value for ([\w.]+): (\S+) ", example)
    method = option.group(1).split(".")[1]
    done = subprocess.run([sys.executable, "run.py", "method=logitspec", f"{option.group(1)}={option.group(2)}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == example, (method, done.stderr)


@pytest.mark.slow
def test_the_quick_start_run_command_runs(tmp_path):
    [command] = [c for c in code_commands(README) if c.startswith("python run.py method=logitspec") and
                 len(shlex.split(c)) == 3]
    tiny = [f"bench.question_file={question_file()}", "bench.subtasks=[translation]", "bench.questions_per_subtask=1",
            "bench.max_new_tokens=8", "bench.warmup=0", "run.progress=false", f"run.results_dir={tmp_path}"]
    done = subprocess.run([sys.executable, *shlex.split(command)[1:], *tiny], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Answers:" in done.stdout and "Speedup" not in done.stdout  # no vanilla run yet: nothing to compare
    assert len(list(tmp_path.glob("smollm2-135m/logitspec-*/answers.jsonl"))) == 1


def test_every_relative_link_of_the_docs_resolves():
    pages = [README, *sorted((ROOT / "docs").rglob("*.md")), ROOT / "results" / "README.md"]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if not re.match(r"[a-z]+://", target) and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
