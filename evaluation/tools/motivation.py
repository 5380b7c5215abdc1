"""The paper's Figure-2 statistic: how often the last logit's top-k already holds the next-next token.

Vanilla greedy decoding on Spec-Bench first turns. At each step the logits z_t decide the pending token g_{t+1};
we record whether g_{t+2} is among the top-k of z_t (k = 1, 5, 10, 20, 50, 64; rank 0, the argmax g_{t+1}, counts
too), and whether plain n-gram retrieval (the LogitSpec pool, lookup on tokens up to t+1) predicts g_{t+2}.

    python -m evaluation.tools.motivation [--questions-per-subtask N] [--max-new-tokens M] [--out results/motivation]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from evaluation.run.config import register_configs
from evaluation.engine import DecodeState, DraftTree, decode_turn
from evaluation.models import load_model
from evaluation.questions import SUBTASKS, load_questions, select_questions
from evaluation.templates import build_prompt_ids
from logitspec.method import LogitSpec

KS = (1, 5, 10, 20, 50, 64)
ROOT = Path(__file__).resolve().parents[2]


class Recorder(LogitSpec):
    """Drafts nothing (so decoding is vanilla) and records, per pending position, the top-64 ids and the
    pool's guess for the token after it. The pool is kept up to date by LogitSpec's own `update`."""

    def __init__(self, model):
        super().__init__(LogitSpec.Config(next_next=False), model)
        self.records: list[tuple[int, list[int], int | None]] = []

    def draft(self, state: DecodeState) -> DraftTree:
        top = torch.topk(state.last_logits, max(KS)).indices.tolist()
        cont = self.pool.lookup(state.tokens)
        self.records.append((len(state.tokens) - 1, top, cont[0] if cont else None))
        return DraftTree()

    @property
    def max_nodes(self) -> int:
        return 0


def turn_hits(recorder: Recorder, tokens: list[int]) -> tuple[dict[int, int], int, int]:
    """Top-k hits per k, n-gram hits and the number of positions whose next-next token is known."""
    hits, ngram, positions = dict.fromkeys(KS, 0), 0, 0
    for pending, top, guess in recorder.records:
        if pending + 1 >= len(tokens):
            continue
        target = tokens[pending + 1]
        positions += 1
        ngram += guess == target
        for k in KS:
            hits[k] += target in top[:k]
    return hits, ngram, positions


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["subtask", "k", "hit_rate", "positions", "ngram_hit_rate"])
        writer.writeheader()
        writer.writerows(rows)


def rows_for(subtask: str, hits: dict[int, int], ngram: int, positions: int) -> list[dict]:
    rate = lambda n: round(n / positions, 4) if positions else float("nan")  # noqa: E731
    return [{"subtask": subtask, "k": k, "hit_rate": rate(hits[k]), "positions": positions,
             "ngram_hit_rate": rate(ngram)} for k in KS]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions-per-subtask", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--out", default="results/motivation")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of conf/, e.g. model=vicuna-7b-v1.3")
    args = parser.parse_args(argv)

    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=args.overrides)
    lm = load_model(cfg.model, cfg.run.device)
    question_file = Path(cfg.bench.question_file)
    if not question_file.is_absolute():
        question_file = ROOT / question_file
    questions = select_questions(load_questions(question_file), list(cfg.bench.subtasks or SUBTASKS),
                                 args.questions_per_subtask)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    totals: dict[str, list] = {}
    for q in questions:
        recorder = Recorder(lm)
        prompt = build_prompt_ids(lm.tokenizer, lm.chat_template, [], q.turns[0])
        result = decode_turn(lm, recorder, prompt, args.max_new_tokens)
        hits, ngram, positions = turn_hits(recorder, prompt + result.new_ids)
        for key in (q.subtask, "all"):
            total = totals.setdefault(key, [dict.fromkeys(KS, 0), 0, 0])
            for k in KS:
                total[0][k] += hits[k]
            total[1] += ngram
            total[2] += positions

    totals["all"] = totals.pop("all")  # the combined row last
    all_rows = []
    for subtask, (hits, ngram, positions) in totals.items():
        rows = rows_for(subtask, hits, ngram, positions)
        all_rows += rows
        if subtask != "all":
            write_csv(out / f"{subtask}.csv", rows)
    write_csv(out / "combined.csv", all_rows)

    print(f"next-next token in the top-k of the last logit ({lm.name}, {args.max_new_tokens} new tokens)")
    print(f"{'subtask':<16}{'positions':>10}" + "".join(f"{'top' + str(k):>8}" for k in KS) + f"{'n-gram':>8}")
    for subtask, (hits, ngram, positions) in totals.items():
        cells = "".join(f"{hits[k] / max(positions, 1):>8.3f}" for k in KS)
        print(f"{subtask:<16}{positions:>10}{cells}{ngram / max(positions, 1):>8.3f}")
    print(f"CSV: {out}")


if __name__ == "__main__":
    main()
