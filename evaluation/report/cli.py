"""The report: speedup, mean accepted tokens, time breakdown and losslessness of each method against vanilla.

    python -m evaluation.report [--results results/runs [more folders]] [--out results]
    python -m evaluation.report --compare A B [--out DIR]     (two run sets side by side: compare.py)

The command line only: `markdown.build` writes the outputs, all of them or none. With no method that has a
vanilla run to compare with, nothing is written: one line names the missing vanilla run(s), exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evaluation.engine.errors import HarnessError
from evaluation.report.markdown import OUTPUTS, NoRuns, NothingToCompare, build


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", nargs="+", default=["results/runs"],
                        help="folder(s) holding the run folders; each folder's methods are compared with its vanilla")
    parser.add_argument("--out", default=None, help="where report.md/.csv go (default: the parent of --results)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"),
                        help="two folders of run folders side by side (with --out: compare.md and compare.csv there)")
    # After a run (run.py): no runs is no news, nothing to compare yet one line, neither an error.
    parser.add_argument("--quiet-if-empty", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compare:
        compare_sets(*args.compare, args.out)
        return
    out = args.out or str(Path(args.results[0]).parent)
    try:
        summary, markdown = build(args.results, out)
    except HarnessError as exc:  # nothing was written: what is there stays as it is
        if args.quiet_if_empty and isinstance(exc, NoRuns):
            return
        if args.quiet_if_empty and isinstance(exc, NothingToCompare):
            print(f"Report not written: {exc}", flush=True)
            return
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:  # the outputs could not be written: none was replaced
        print(f"error: cannot write the report into {out}: {exc}; what was there is left as it is", file=sys.stderr)
        sys.exit(2)
    print(markdown)
    print(f"Written: {out}/" + ", ".join(OUTPUTS))


def compare_sets(a: str, b: str, out: str | None) -> None:
    from evaluation.files import write_text
    from evaluation.report.compare import compare

    try:
        table, markdown = compare(a, b)
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            write_text(Path(out) / "compare.csv", table.to_csv(index=False))
            write_text(Path(out) / "compare.md", markdown)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(markdown)
