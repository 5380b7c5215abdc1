"""Outputs are replaced only by complete new ones: written beside the old file under a temporary name, then
renamed over it (`os.replace` is atomic on one file system), so a crash or a kill never leaves half a report."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """`with replacing("out/report.csv") as tmp: table.to_csv(tmp)`: `tmp` keeps the suffix, so writers that
    pick a format from it (matplotlib, pandas) still do; the old file stays until `tmp` is complete."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text)
