"""Several methods answering the same questions in turn, question by question, in one process.

    python -m evaluation.run.interleave method=vanilla method=pld "method=logitspec method.draft_tree_capacity=16" \\
        -- bench.questions_per_subtask=2 bench.max_new_tokens=128 run.draft_budget=auto

Each argument before `--` is one cell (Hydra overrides, quoted when several); those after `--` apply to every cell.
`run.py -m` runs one method after another, so a machine whose speed drifts over minutes (a shared VM, a CPU that
heats up) lends each method a different machine, and a method's ratio to vanilla measures the drift as well.
Here every question is answered by every cell before the next question starts, so each method's answer to a
question and vanilla's lie seconds apart, and the per-question ratios of the report's paired tests compare like
with like. The cells' order is drawn afresh for each question (seeded by `run.seed`, the repeat and the question's
place, so a rerun and a resumed run keep it): a fixed or rotating order would keep each cell's neighbours, and a
cell that always runs right after the heaviest one (a CPU still hot, caches full of another method's state) would
carry that into its ratio.

Each cell writes its own run folder in `run.results_dir`, the format `run.py` writes, and resumes the same way. The
folders' identity records the schedule and the cells it interleaved, so the report compares each method only with
the vanilla run that was interleaved with it. Give vanilla as one of the cells: without it nothing has a reference.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from pathlib import Path

import numpy as np

from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from evaluation.engine.errors import HarnessError
from evaluation.files import file_sha256
from evaluation.run.answerers import InProcess, build_method, check_loaded_model, check_prompts_fit, read_questions
from evaluation.run.config import register_configs
from evaluation.run.folder import open_run
from evaluation.run.orchestrate import Progress
from evaluation.run import preflight
from evaluation.run.validation import validate
from evaluation.models import load_model

CONF = Path(__file__).resolve().parent.parent.parent / "conf"
register_configs()  # the schemas `conf/` is checked against, as run.py registers them


def compose_cell(cell: str, common: list[str]):
    """The config of one cell: the common overrides, then the cell's own."""
    overrides = [*common, *shlex.split(cell)]
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
            return compose("config", overrides=overrides)
    except ConfigCompositionException as exc:
        from evaluation.run.validation import option_error_from_hydra

        error = option_error_from_hydra(exc, overrides)
        raise HarnessError(f"cell {cell!r}: {error or ' '.join(str(exc).split())}") from None


class Cell:
    """One method's setting: the overrides it was given, its run specification and the answerer that runs it."""

    def __init__(self, given: str, spec):
        self.given, self.spec = given, spec
        self.label = spec.label()
        self.answerer: InProcess | None = None


def prepare_cells(specs: list[str], common: list[str]) -> tuple[list[Cell], list, object]:
    """Every cell's config checked, then the one model loaded and each method built on it; a problem raises
    `HarnessError` before anything is written."""
    if not specs:
        raise HarnessError("no cells: give one or more, e.g. method=vanilla method=pld -- bench.questions_per_subtask=2")
    cells = []
    for given in specs:
        cfg = compose_cell(given, common)
        try:
            cells.append(Cell(given, validate(cfg)))
        except HarnessError as exc:
            raise HarnessError(f"cell {given!r}: {exc}") from None
    first = cells[0].spec
    for cell in cells:
        if cell.spec.run.workers is not None:
            raise HarnessError(f"cell {cell.given!r}: run.workers runs on Ray, one method at a time; interleaving "
                               "runs every cell in this process (drop run.workers)")
        for group in ("model", "bench"):
            if getattr(cell.spec, group) != getattr(first, group):
                raise HarnessError(f"cell {cell.given!r}: its {group} options differ from cell {cells[0].given!r}'s; "
                                   f"interleaved cells answer the same questions with the same model (put {group} "
                                   "options after --)")
        for option in ("device", "seed", "repeats"):
            if getattr(cell.spec.run, option) != getattr(first.run, option):
                raise HarnessError(f"cell {cell.given!r}: run.{option} differs from cell {cells[0].given!r}'s "
                                   "(put it after --)")
    labels = [cell.label for cell in cells]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise HarnessError(f"cells given twice: {', '.join(twice)}")

    preflight.check([cell.spec for cell in cells])  # every cell's checkpoints found before the target loads
    questions = read_questions(first)
    lm = load_model(first.model, first.run.device)
    for cell in cells:
        check_loaded_model(cell.spec, lm)
    check_prompts_fit(lm, questions)
    for cell in cells:
        try:
            cell.answerer = InProcess(cell.spec, lm, build_method(cell.spec, lm))
        except HarnessError as exc:
            raise HarnessError(f"cell {cell.given!r}: {exc}") from None
    return cells, questions, lm


def turn_order(cells: int, seed: int, repeat: int, number: int) -> list[int]:
    """The order in which the cells answer question `number` of repeat `repeat`: a permutation drawn from a
    generator seeded by all three, so position and neighbours vary from question to question and stay the same
    when the run is repeated or resumed."""
    return [int(i) for i in np.random.default_rng([seed, repeat, number]).permutation(cells)]


def interleave(specs: list[str], common: list[str]) -> list[Path]:
    """Answer every question with every cell in turn, `run.repeats` times; return the run folders. One progress
    bar covers the whole schedule (every repeat, cell and question still to answer)."""
    cells, questions, lm = prepare_cells(specs, common)
    first = cells[0].spec
    question_sha = file_sha256(Path(first.bench.question_file))
    schedule = {"interleaved": sorted(cell.label for cell in cells)}
    folders = []
    progress = None
    for repeat in range(first.run.repeats):
        with contextlib.ExitStack() as stack:
            runs = [stack.enter_context(open_run(cell.spec, cell.answerer, questions, question_sha, repeat, schedule))
                    for cell in cells]
            todo = [{q.question_id for q in run.todo} for run in runs]
            # What is left: this repeat's answers still to give, and every answer of the repeats after it (their
            # folders are opened in turn, so a resumed later repeat shortens the total when it opens).
            left = sum(map(len, todo)) + (first.run.repeats - 1 - repeat) * len(cells) * len(questions)
            if progress is None:
                progress = Progress(left, f"{first.model.name} {len(cells)} methods interleaved"
                                    + (f", {first.run.repeats} repeats" if first.run.repeats > 1 else ""),
                                    first.run.progress)
            else:
                progress.set_total(progress.bar.n + left)
            for cell, run in zip(cells, runs):
                if run.todo and first.bench.warmup:
                    progress.note(f"warming up {cell.label}")
                    cell.answerer.warm_up(questions[0])
            for number, question in enumerate(questions):
                for i in turn_order(len(cells), first.run.seed, repeat, number):
                    if question.question_id not in todo[i]:
                        continue
                    record = cells[i].answerer.answer(question)
                    runs[i].append(record)
                    progress.advance(record, cells[i].label)
        folders += [run.folder for run in runs]
    if progress is not None:
        progress.close()
    return folders


def parse(argv: list[str]) -> tuple[list[str], list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m evaluation.run.interleave", description=__doc__.split("\n\n")[0],
        usage="%(prog)s CELL [CELL ...] [-- OVERRIDE ...]")
    parser.add_argument("cells", nargs="*", help="Hydra overrides of one cell, quoted when several")
    if "--" in argv:
        split = argv.index("--")
        cells, common = argv[:split], argv[split + 1:]
    else:
        cells, common = argv, []
    return parser.parse_args(cells).cells, common


def main(argv: list[str] | None = None) -> None:
    from evaluation.run.folder import finished_line
    from evaluation.run.stopping import clean_stop

    specs, common = parse(sys.argv[1:] if argv is None else argv)
    try:
        cfg = compose_cell(specs[0], common)
        with clean_stop(cfg.run.results_dir):
            folders = interleave(specs, common)
            for folder in folders:
                print(finished_line(folder))
            if cfg.run.report:
                from evaluation.report.cli import main as report_main

                report_main(["--results", cfg.run.results_dir, "--quiet-if-empty"])
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    from evaluation.versions import require_supported_environment

    require_supported_environment()
    main()
