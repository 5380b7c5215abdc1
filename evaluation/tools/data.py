"""`make data`: put the question sets under data/, each checked against its pinned sha256.

Sources, in order: $SPEC_BENCH_DATA (a folder laid out like data/), ../shared/data when it exists, else a
download from the upstream repository at a pinned commit. Nothing is downloaded at run time: the runner only
reads data/.
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


def local_source() -> Path | None:
    for candidate in (os.environ.get("SPEC_BENCH_DATA"), ROOT.parent / "shared" / "data"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def fetch(name: str, target_dir: Path, source: Path | None) -> str:
    sha, url = QUESTION_SETS[name]
    target = target_dir / name / "question.jsonl"
    if target.is_file() and file_sha256(target) == sha:
        return "present"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".part")
    if source is not None:
        origin = source / name / "question.jsonl"
        if not origin.is_file():
            raise SystemExit(f"error: {origin} is missing")
        shutil.copyfile(origin, tmp)
        licence = source / name / "LICENSE"
        if licence.is_file():
            shutil.copyfile(licence, target.parent / "LICENSE")
        how = f"copied from {origin}"
    else:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as f:
            shutil.copyfileobj(response, f)
        how = f"downloaded from {url}"
    if file_sha256(tmp) != sha:
        tmp.unlink()
        raise SystemExit(f"error: {name}: sha256 mismatch ({how}); expected {sha}")
    tmp.rename(target)
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
