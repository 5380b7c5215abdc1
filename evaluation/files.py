"""Outputs are replaced only by complete new ones: written beside the old file under a temporary name, then
renamed over it (`os.replace` is atomic on one file system), so a crash or a kill never leaves half a report.

A set of outputs that belong together (a report's Markdown and its tables) is replaced together or not at all
(`replacing_together`): every new file is written first, and only once all are complete are they renamed into
place, one after another; should a rename fail, the files already replaced get their old contents back.

`file_sha256` is how a file's contents are identified everywhere (question sets, the converted model's source, REST's
corpus and datastore, the offline bundle's files)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path
from typing import Iterable, Iterator


def _temporary(path: Path, tag: str = "tmp") -> Path:
    return path.with_name(f".{path.stem}.{tag}{os.getpid()}{path.suffix}")


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """`with replacing("out/report.csv") as tmp: table.to_csv(tmp)`: `tmp` keeps the suffix, so writers that
    pick a format from it (matplotlib, pandas) still do; the old file stays until `tmp` is complete."""
    path = Path(path)
    tmp = _temporary(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def replacing_together(paths: Iterable[str | os.PathLike]) -> Iterator[list[Path]]:
    """`with replacing_together([md, csv]) as (md_tmp, csv_tmp): ...`: one temporary path per output, each of
    which must be written in the block. When the block ends normally, every output is replaced by its new file;
    when it raises (or a temporary file was not written), none is, and the temporary files are removed."""
    targets = [Path(p) for p in paths]
    if len(set(targets)) != len(targets):
        raise ValueError(f"the same output twice in {[str(t) for t in targets]}")
    temps = [_temporary(t) for t in targets]
    backups = [_temporary(t, "old") for t in targets]
    try:
        yield temps
        missing = [str(t) for t, tmp in zip(targets, temps) if not tmp.is_file()]
        if missing:
            raise FileNotFoundError(f"not written, so nothing was replaced: {', '.join(missing)}")
        for target, backup in zip(targets, backups):  # the old contents, kept until every new file is in place
            if target.exists():
                _keep_copy(target, backup)
        done: list[Path] = []
        try:
            for target, tmp in zip(targets, temps):
                os.replace(tmp, target)
                done.append(target)
        except BaseException:
            for target, backup in zip(targets, backups):
                if target in done:
                    if backup.exists():
                        os.replace(backup, target)
                    else:
                        target.unlink(missing_ok=True)  # it did not exist before
            raise
    finally:
        for leftover in (*temps, *backups):
            leftover.unlink(missing_ok=True)


def _keep_copy(path: Path, backup: Path) -> None:
    """`backup` with `path`'s contents: a hard link where the file system has them (no copying), else a copy."""
    backup.unlink(missing_ok=True)
    try:
        os.link(path, backup)
    except OSError:
        shutil.copy2(path, backup)


def write_text(path: str | os.PathLike, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text)


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes (hex), read in blocks of 1 MiB: a model file never sits in memory whole."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
