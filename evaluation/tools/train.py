"""Train a draft of one family for a target: `python -m evaluation.tools.train [family=<family>] [model=<model>]
[train=<recipe>] [train.key=value ...]` (`make train FAMILY=... MODEL=...`). The family's YAML (conf/family/) lays
its defaults over the recipe (conf/train/); the trainer is drafts/train.py; a rerun resumes."""

from __future__ import annotations

import json
import sys

import hydra
from omegaconf import OmegaConf

from drafts.train import Trainer, options_from
from evaluation.engine.errors import HarnessError, OptionError
from evaluation.families import FamilyEntry


def train(cfg) -> dict:
    from evaluation.models import load_model
    from evaluation.run.config import ModelConfig

    entry = FamilyEntry.from_config(OmegaConf.to_container(cfg, resolve=True), "family=...")
    options = options_from(cfg.train)
    model_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg.model))
    model_cfg.dtype = "float32"  # the target's weights stay float32; `train.dtype` sets the autocast
    try:  # before the model loads: its name becomes a folder name
        model_cfg.check()
    except OptionError as exc:
        raise exc.in_group("model") from None
    lm = load_model(model_cfg, options.device)
    return Trainer(lm, options, model_cfg.name, entry).run()


@hydra.main(version_base="1.3", config_path="../../conf", config_name="train_config")
def main(cfg) -> None:
    try:
        row = train(cfg)
    except HarnessError as exc:  # one line and exit status 2, as a run reports a bad option
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(row))


if __name__ == "__main__":
    from evaluation.versions import require_supported_environment

    require_supported_environment()
    main()
