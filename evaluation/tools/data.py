"""`make data`: put the question sets under data/, each checked against its pinned sha256.

Sources, in order: $SPEC_BENCH_DATA (a folder laid out like data/), ../shared/data when it exists, else a
download from the upstream repository at a pinned commit. Nothing is downloaded at run time: the runner only
reads data/. A set that cannot be had stops the command with one line naming it and the fix, and leaves no
partial file or empty folder behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import urllib.request
from pathlib import Path

from evaluation.files import file_sha256

ROOT = Path(__file__).resolve().parents[2]
# name: (sha256, upstream URL at a pinned commit)
QUESTION_SETS = {
    "spec_bench": ("4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04",
                   "https://raw.githubusercontent.com/hemingkx/Spec-Bench/fd2c1cd7/data/spec_bench/question.jsonl"),
    "humaneval": ("ce0244e2b228339e9a11afc63a151719beede1e389fdaec7cd9751d33902180e",
                  "https://raw.githubusercontent.com/AMD-AIG-AIMA/Gumiho/9a1bc87c/gumiho/data/humaneval/question.jsonl"),
    "gsm8k": ("a55920b2f2aac724241124c59e5b8e8168dbbeb2ab0fdbee17d5b0ab6db5ff27",
              "https://raw.githubusercontent.com/AMD-AIG-AIMA/Gumiho/9a1bc87c/gumiho/data/gsm8k/question.jsonl"),
    "alpaca": ("8ad3e5a7fc61b88d8e25edb81a52a2ce00a04494d5694c122cb11a5cc26a00df",
               "https://raw.githubusercontent.com/AMD-AIG-AIMA/Gumiho/9a1bc87c/gumiho/data/alpaca/question.jsonl"),
}


OFFLINE = ("with no network, point SPEC_BENCH_DATA at a folder laid out like data/ (<set>/question.jsonl for "
           + ", ".join(QUESTION_SETS) + ") and run `make data` again")


def local_source() -> Path | None:
    named = os.environ.get("SPEC_BENCH_DATA")
    if named:
        if not Path(named).expanduser().is_dir():
            raise SystemExit(f"error: SPEC_BENCH_DATA={named} is not a folder (a folder laid out like data/)")
        return Path(named).expanduser()
    shared = ROOT.parent / "shared" / "data"
    return shared if shared.is_dir() else None


def fetch(name: str, target_dir: Path, source: Path | None) -> str:
    """Put one question set in place, or stop with one line; a failure leaves neither a partial file nor a folder
    it created."""
    sha, url = QUESTION_SETS[name]
    target = target_dir / name / "question.jsonl"
    if target.is_file() and file_sha256(target) == sha:
        return "present"
    created = [d for d in (target_dir, target.parent) if not d.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".part")
    try:
        if source is not None:
            origin = source / name / "question.jsonl"
            if not origin.is_file():
                raise SystemExit(f"error: {origin} is missing (the folder of question sets must hold "
                                 f"{name}/question.jsonl)")
            shutil.copyfile(origin, tmp)
            licence = source / name / "LICENSE"
            if licence.is_file():
                shutil.copyfile(licence, target.parent / "LICENSE")
            how = f"copied from {origin}"
        else:
            try:
                with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as f:
                    shutil.copyfileobj(response, f)
            except OSError as exc:  # no network, refused, timed out (URLError is an OSError)
                reason = getattr(exc, "reason", None) or exc
                raise SystemExit(f"error: {name}: cannot download {url} ({reason}); {OFFLINE}") from None
            how = f"downloaded from {url}"
        if file_sha256(tmp) != sha:
            raise SystemExit(f"error: {name}: sha256 mismatch ({how}); expected {sha}")
        tmp.rename(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        for folder in reversed(created):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    return how


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Put the question sets under data/ and verify them.")
    parser.add_argument("--out", default=str(ROOT / "data"))
    args = parser.parse_args(argv)
    source = local_source()
    for name in QUESTION_SETS:
        print(f"{name}: {fetch(name, Path(args.out), source)}", file=sys.stderr)


if __name__ == "__main__":
    main()
