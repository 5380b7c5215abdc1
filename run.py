"""Run one decoding method on a question set: `python run.py method=vanilla bench.questions_per_subtask=2`.

Hydra composes `conf/`; `python run.py -m method=vanilla,...` runs several methods in one process.
"""

import sys

import hydra

from evaluation.config import register_configs
from evaluation.errors import HarnessError

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg) -> None:
    from evaluation import report, runner

    try:
        for folder in runner.run(cfg):
            print(f"Answers: {folder}")
        if cfg.run.report:
            report.main(["--results", cfg.run.results_dir, "--quiet-if-empty"])
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
