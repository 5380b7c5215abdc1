"""Run one decoding method on a question set: `python run.py method=vanilla bench.questions_per_subtask=2`.

Hydra composes `conf/`; `python run.py -m method=vanilla,...` runs several methods in one process.
A bad option ends the command with one line on stderr and exit status 2, before the model loads
(`evaluation.run.validation`), a mistyped choice (`method=logitsepc`) too, with the closest name; Hydra reports
the errors it alone understands (a broken YAML) as it always does.
"""

import os
import sys
from pathlib import Path

from evaluation.versions import require_supported_environment

require_supported_environment()  # one line per missing package or unsupported version, before anything is imported

import hydra  # noqa: E402
from hydra.errors import ConfigCompositionException  # noqa: E402

from evaluation.run.config import register_configs  # noqa: E402
from evaluation.engine.errors import HarnessError  # noqa: E402

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg) -> None:
    from evaluation.report.cli import main as report_main
    from evaluation.run.folder import finished_line
    from evaluation.run.orchestrate import run
    from evaluation.run.stopping import clean_stop

    try:
        with clean_stop(cfg.run.results_dir):
            for folder in run(cfg):
                print(finished_line(folder))
            if cfg.run.report and launched_elsewhere():
                print(f"Report: `python -m evaluation.report --results {cfg.run.results_dir}` once every job is done")
            elif cfg.run.report:
                report_main(["--results", cfg.run.results_dir, "--quiet-if-empty"])
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def launched_elsewhere() -> bool:
    """A job of a cluster launcher (Slurm, Ray, submitit_local): its sibling cells run at the same time, so one
    report over all of them comes after, not one per job."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return False
    launcher = HydraConfig.get().get("launcher") or {}
    return not str(launcher.get("_target_", "")).endswith(".BasicLauncher")


def cli() -> None:
    """`main` with Hydra's type and key errors about an option turned into the same one-line error."""
    from evaluation.run.validation import code_in_config_files

    code = code_in_config_files(sys.argv[1:], Path(__file__).resolve().parent / "conf")
    if code:
        print(f"error: {code}", file=sys.stderr)
        sys.exit(2)
    user_wants_full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then raises its errors instead of printing them
    try:
        main()
    except ConfigCompositionException as exc:
        from evaluation.run.validation import option_error_from_hydra

        error = option_error_from_hydra(exc, sys.argv[1:])
        if error is None or user_wants_full_error:
            report_as_hydra(exc, user_wants_full_error)
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:  # noqa: BLE001 - anything else Hydra raises is reported the way Hydra reports it
        report_as_hydra(exc, user_wants_full_error)


def report_as_hydra(exc: Exception, full_error) -> None:
    """Print `exc` exactly as Hydra would have (or raise it with HYDRA_FULL_ERROR set) and exit with status 1."""
    from hydra._internal.utils import run_and_report

    if full_error:
        raise exc
    del os.environ["HYDRA_FULL_ERROR"]

    def reraise():
        raise exc

    run_and_report(reraise)
    sys.exit(1)


if __name__ == "__main__":
    cli()
