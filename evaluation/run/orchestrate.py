"""Spec-Bench's procedure for one method: check everything, read the questions, answer them `run.repeats` times
into run folders (`evaluation.run.folder`), in this process or on Ray workers (`run.workers`).

`run(cfg)` is what `run.py` calls; `evaluation.run.interleave` runs several methods question by question with the
same pieces.
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from evaluation.files import file_sha256
from evaluation.run.answerers import InProcess, load_target, read_questions
from evaluation.run.folder import open_run
from evaluation.run import preflight
from evaluation.run.validation import validate


class Progress:
    """One bar over a whole bench (runs x questions), with the live tokens per second and mean accepted tokens of
    every answer written so far, and tqdm's rate and ETA."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.bar = tqdm(total=total, desc=desc, unit="answer", disable=not enabled, dynamic_ncols=True)
        self.tokens = self.seconds = self.steps = 0

    def advance(self, record: dict, label: str = "") -> None:
        if record["status"] == "ok":
            choice = record["choices"][0]
            self.tokens += sum(choice["new_tokens"])
            self.seconds += sum(choice["wall_time"])
            self.steps += sum(choice["decoding_steps"])
        rates = {"tok_s": f"{self.tokens / self.seconds:.1f}", "MAT": f"{self.tokens / self.steps:.2f}"} \
            if self.steps else {}
        self.bar.update(1)
        self.bar.set_postfix(**({"method": label} if label else {}), **rates)

    def note(self, text: str) -> None:
        """Say what is happening before the next answer (e.g. a method's untimed warm-up)."""
        self.bar.set_postfix_str(text)

    def set_total(self, total: int) -> None:
        self.bar.total = total
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def answer_into(spec, answerer, run, questions, desc: str) -> None:
    """Answer what `run` still lacks with `answerer`, one whole line at a time."""
    if not run.todo:
        return
    progress = Progress(len(run.todo), desc, spec.run.progress)
    if spec.bench.warmup:
        progress.note("warming up")
    answerer.warm_up(questions[0])
    for record in answerer.answers(run.todo):
        run.append(record)
        progress.advance(record)
    progress.close()


def run_once(spec, answerer, questions, question_sha: str, repeat: int) -> Path:
    """One pass over the questions into the folder of this run's identity, resuming what is there.

    `answerer` is `InProcess` or the Ray workers; either way this process alone writes the folder, one whole
    answer line at a time, under the folder's lock."""
    with open_run(spec, answerer, questions, question_sha, repeat) as run:
        desc = f"{spec.model.name} {run.label}" + (
            f" repeat {repeat + 1}/{spec.run.repeats}" if spec.run.repeats > 1 else "")
        answer_into(spec, answerer, run, questions, desc)
    return run.folder


def run(cfg) -> list[Path]:
    """Answer the selected questions with the configured method, `run.repeats` times; return the run folders.
    Every option is checked and the questions read before a model loads; with `run.workers`, Ray workers answer
    (`evaluation.run.ray_workers`, the only import of Ray)."""
    spec = validate(cfg)
    preflight.check([spec])  # its checkpoints found before the target loads
    questions = read_questions(spec)
    question_sha = file_sha256(Path(spec.bench.question_file))
    if spec.run.workers is not None:
        from evaluation.run.ray_workers import ray_answerer

        with ray_answerer(spec, questions) as workers:
            return [run_once(spec, workers, questions, question_sha, repeat) for repeat in range(spec.run.repeats)]
    here = InProcess(spec, load_target(spec, questions))
    return [run_once(spec, here, questions, question_sha, repeat) for repeat in range(spec.run.repeats)]
