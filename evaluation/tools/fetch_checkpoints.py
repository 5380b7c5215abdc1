"""`make fetch-checkpoints MODEL=X DEST=dir`: everything a GPU node without a network needs to run `make bench` or
`make reproduce-specbench` for the target X, downloaded into one folder to copy there.

- `DEST/hub/`: a Hugging Face hub cache holding the target's weights and tokenizer and every released checkpoint
  paired with it (conf/checkpoints.yaml). On the node, `HF_HUB_CACHE=DEST/hub` makes the same hub ids resolve from
  it, so no option changes; the run's preflight switches the hub client offline when it finds them all there.
- `DEST/data/`: the question sets (`SPEC_BENCH_DATA=DEST/data make data` on the node).
- `DEST/cache/rest/`: REST's datastore for the target's tokenizer (`SPECDEC_CACHE=DEST/cache` on the node).
- `DEST/env.sh`: those three variables, to `source` on the node.

Downloads resume where they stopped (huggingface_hub keeps partial files), so an interrupted fetch is run again.
The plan, with each item's size from the hub, is printed before anything is downloaded; `--dry-run` prints only
the plan (offline it names the items without sizes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from evaluation.engine.errors import HarnessError

ROOT = Path(__file__).resolve().parents[2]
# What a model repository's snapshot needs: the configs, the tokenizer and the weights (safetensors when the
# repository has them, else the PyTorch files), not the other formats some repositories also carry.
CONFIG_FILES = ["*.json", "*.model", "*.txt", "*.tiktoken", "*.py"]


@dataclass
class Item:
    what: str  # "target", "eagle checkpoint (eagle, eagle2)", ...
    hub_id: str
    size: int | None = None  # bytes, from the hub (None: unknown, e.g. offline)
    patterns: list[str] | None = None


def plan(model: str) -> list[Item]:
    """The target `model` (a conf/model name or short name) and every released checkpoint paired with it that a bench
    of it runs, each hub id once."""
    from evaluation.catalog import bench_plan, config_method, import_class, model_name

    name = model_name(model)
    hf_id = target_hub_id(model)
    items = [Item("target", hf_id)] if hf_id else []
    settings, _ = bench_plan(model)
    by_id: dict[str, list[str]] = {}
    for config_name in settings:
        cls = import_class(config_method(config_name).target)
        hub_id = cls.trained_source(cls.Config(), name)  # what it loads with its defaults
        if hub_id is not None and not Path(hub_id).is_dir():
            by_id.setdefault(hub_id, [cls.checkpoint_kind]).append(config_name)
    for hub_id, (kind, *methods) in by_id.items():
        items.append(Item(f"{kind} ({', '.join(methods)})", hub_id))
    return items


def target_hub_id(model: str) -> str | None:
    """The hub id `conf/model/<model>.yaml` gives (None for the embedded model)."""
    from hydra import compose, initialize_config_dir

    from evaluation.run.config import register_configs

    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=[f"model={model}"])
    return None if cfg.model.embedded else str(cfg.model.hf_id)


def size_up(items: list[Item]) -> None:
    """Each item's files to fetch and their total size, from the hub (left unknown when it does not answer)."""
    from huggingface_hub import HfApi

    api = HfApi()
    for item in items:
        try:
            info = api.model_info(item.hub_id, files_metadata=True, timeout=10)
        except Exception as exc:  # noqa: BLE001 - offline, gated, unknown: the download will say
            print(f"  {item.hub_id}: size unknown ({(str(exc).strip().splitlines() or [type(exc).__name__])[0]})",
                  file=sys.stderr)
            continue
        files = {s.rfilename: (s.size or 0) for s in info.siblings or []}
        item.patterns = weight_patterns(list(files))
        item.size = sum(size for name, size in files.items() if matches(name, item.patterns))


def weight_patterns(files: list[str]) -> list[str]:
    """Configs and tokenizer, and the weights in one format: safetensors when there are any, else .bin/.pt."""
    weights = ["*.safetensors"] if any(f.endswith(".safetensors") for f in files) else ["*.bin", "*.pt"]
    return CONFIG_FILES + weights


def matches(name: str, patterns: list[str]) -> bool:
    from fnmatch import fnmatch

    return any(fnmatch(name, pattern) for pattern in patterns)


def gigabytes(size: int | None) -> str:
    return "size unknown" if size is None else f"{size / 1e9:.2f} GB"


def fetch(model: str, dest: Path, dry_run: bool = False) -> None:
    items = plan(model)
    if not dry_run:
        size_up(items)
    print(f"fetch-checkpoints {model} into {dest}:")
    for item in items:
        print(f"  {item.what:<40} {item.hub_id:<45} {gigabytes(item.size)}")
    known = [item.size for item in items if item.size is not None]
    print(f"  total {gigabytes(sum(known)) if known else 'unknown'}, plus the question sets and REST's datastore")
    if dry_run:
        return
    from huggingface_hub import snapshot_download

    hub = dest / "hub"
    hub.mkdir(parents=True, exist_ok=True)
    for number, item in enumerate(items, 1):
        print(f"[{number}/{len(items)}] {item.hub_id}", flush=True)
        try:
            folder = snapshot_download(item.hub_id, cache_dir=hub, allow_patterns=item.patterns or None)
        except Exception as exc:  # noqa: BLE001 - one line: network, auth (gated Llama), unknown repository
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise HarnessError(f"cannot fetch {item.hub_id}: {first} (run again to resume; a gated model needs "
                               f"`huggingface-cli login` first)") from None
        print(f"  {gigabytes(folder_size(Path(folder)))} in {folder}", flush=True)
    data = dest / "data"
    source = ROOT / "data"
    if not (source / "spec_bench" / "question.jsonl").is_file():
        raise HarnessError("question sets not found under data/: run `make data` first")
    shutil.copytree(source, data, dirs_exist_ok=True)
    print(f"question sets: {data}")
    datastore = build_rest_datastore(model, hub, dest / "cache")
    if datastore is not None:
        print(f"REST datastore: {datastore}")
    (dest / "env.sh").write_text(
        "# source this on the offline node: the hub ids resolve from the cache copied here\n"
        f'here="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"\n'
        'export HF_HUB_CACHE="$here/hub" HF_HUB_OFFLINE=1 SPECDEC_CACHE="$here/cache" SPEC_BENCH_DATA="$here/data"\n')
    print(f"done: copy {dest} to the node, then `source {dest.name}/env.sh` there (docs/gpu-and-clusters.md)")


def build_rest_datastore(model: str, hub: Path, cache: Path) -> Path | None:
    """REST's default datastore for the target's tokenizer, built into `cache` as a run would find it there."""
    hub_id = target_hub_id(model)
    if hub_id is None:
        return None
    from transformers import AutoTokenizer

    from baselines.rest_datastore import build_datastore

    tokenizer = AutoTokenizer.from_pretrained(hub_id, cache_dir=hub)
    previous = os.environ.get("SPECDEC_CACHE")
    os.environ["SPECDEC_CACHE"] = str(cache)
    try:
        return build_datastore(tokenizer)
    finally:
        if previous is None:
            os.environ.pop("SPECDEC_CACHE", None)
        else:
            os.environ["SPECDEC_CACHE"] = previous


def folder_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a conf/model name (vicuna-7b, llama-3.1-8b, ...)")
    parser.add_argument("--dest", required=True, help="the folder to fill (created; an earlier fetch resumes)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan only")
    args = parser.parse_args(argv)
    try:
        fetch(args.model, Path(args.dest).expanduser().resolve(), args.dry_run)
    except HarnessError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
