"""The token counts of a draft's training text, for a draft trained before drafts carried them.

    python -m evaluation.tools.token_counts DRAFT_FOLDER [--model smollm2-135m]

A reduced draft vocabulary (`method.draft_vocab=N`) is the N target tokens most frequent in the assistant text the
draft was trained on, read from the draft's `token_counts.csv`; training writes that file. For an older draft
this tool recounts the same text from its manifest (the corpus, the records read and `max_length`) with the
target's tokenizer and chat template, and adds the file to the folder (the draft's weights are not touched).
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import takewhile
from pathlib import Path

from evaluation.engine.errors import HarnessError
from evaluation.files import write_text
from drafts.checkpoint import TOKEN_COUNTS, is_harness_draft, token_counts_text
from drafts.data import count_assistant_tokens, iter_samples


ROOT = Path(__file__).resolve().parent.parent.parent


def recount(folder: Path, model: str) -> Path:
    """Count the assistant tokens of the records `folder`'s manifest says it read; write token_counts.csv."""
    from hydra import compose, initialize_config_dir

    from evaluation.models import load_model
    from evaluation.run.config import register_configs

    if not is_harness_draft(folder):
        raise HarnessError(f"{folder} is not a draft written by the harness (no manifest.json and config.json)")
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    try:
        records, options = int(manifest["data"]["records_read"]), manifest["options"]
        max_length, corpus = int(options["max_length"]), options.get("corpus")
    except (KeyError, TypeError, ValueError):
        raise HarnessError(f"{folder / 'manifest.json'} does not say which records the draft read") from None
    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=[f"model={model}", "model.dtype=float32"])
    lm = load_model(cfg.model, "cpu")
    if manifest.get("target") not in (None, lm.name):
        raise HarnessError(f"draft {folder} was trained for {manifest['target']!r}, not {lm.name!r}")
    samples = takewhile(lambda s: s.record < records,
                        iter_samples(lm.tokenizer, lm.chat_template, max_length, 0, corpus))
    counts = count_assistant_tokens(samples, lm.model.config.vocab_size)
    path = folder / TOKEN_COUNTS
    write_text(path, token_counts_text(counts))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args(argv)
    try:
        path = recount(args.folder, args.model)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(f"Written: {path}")


if __name__ == "__main__":
    main()
