"""REST's datastore: every turn of a ShareGPT-style corpus, tokenized by the target tokenizer, and its suffix array.

Layout of a datastore folder (see docs/methods/rest.md):
  tokens.npy    int32 [n]   every entry's token ids, concatenated without separators (as REST's writer does)
  starts.npy    int64 [e+1] where each entry starts in `tokens`, plus n at the end (entry seams)
  sa.npy        int32 [n]   the suffix array of `tokens` in plain lexicographic order (int64 past 2^31 tokens)
  manifest.json             tokenizer / corpus / options hashes, sizes, file digests (deterministic)
  build.json                build time and date (the only file that differs between two identical builds)

An entry is one turn's `value`, encoded with the tokenizer's own special tokens (a BOS when the tokenizer adds
one; SmolLM2's adds none). Same inputs give byte-identical tokens/starts/sa/manifest files.

    python -m baselines.rest_datastore --model smollm2-135m [--corpus PATH] [--max-conversations N] [--out DIR]
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from evaluation.corpus import corpus_path, iter_records
from evaluation.engine.errors import HarnessError
from evaluation.files import file_sha256

FORMAT_VERSION = 1
FILES = ("tokens.npy", "starts.npy", "sa.npy")
TOKENIZE_BATCH = 2048  # turns per batch call of the fast tokenizer


# ----------------------------------------------------------------------------------------------- corpus
def conversation_turns(record: dict) -> list[str]:
    """Every turn's text of one ShareGPT record, human and assistant alike (REST's small datastore)."""
    return [turn.get("value") or "" for turn in record.get("conversations") or []]


# ----------------------------------------------------------------------------------------------- hashes
def tokenizer_hash(tokenizer) -> str:
    """sha256 of the tokenizer's full serialization (vocab, merges, normalizer, post-processor: the BOS rule)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    else:  # a slow tokenizer: its vocabulary and special tokens
        text = json.dumps([sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def options_hash(options: dict) -> str:
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()


def default_datastore_dir(tok_hash: str, corpus_hash: str, options: dict) -> Path:
    from evaluation.models import default_cache_dir

    return default_cache_dir() / "rest" / f"{tok_hash[:16]}-{corpus_hash[:16]}-{options_hash(options)[:16]}"


# ----------------------------------------------------------------------------------------------- build
def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Suffix array of an integer sequence, in plain lexicographic order (a shorter suffix before its extensions).

    pydivsufsort sorts bytes; given an integer array it rewrites the values as fixed-width big-endian bytes (which
    keeps their order), sorts the byte suffixes and keeps those that start on a value boundary.
    """
    from pydivsufsort import divsufsort

    if len(tokens) == 0:
        return np.zeros(0, dtype=np.int32)
    if len(tokens) == 1 or tokens.min() == tokens.max():
        # A constant sequence (pydivsufsort cannot size its alphabet): longer suffixes sort after shorter ones.
        return np.arange(len(tokens) - 1, -1, -1, dtype=np.int32)
    sa = divsufsort(np.ascontiguousarray(tokens, dtype=np.int32))
    return sa.astype(np.int32 if len(tokens) < 2**31 else np.int64)


def _tokenize_corpus(tokenizer, path: Path, max_conversations: Optional[int], progress: bool):
    """Token ids of every turn, entry by entry, batched through the fast tokenizer."""
    from tqdm import tqdm

    pieces, lengths, batch = [], [], []
    stats: dict = {}
    turns = conversations = 0
    bar = tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc="REST datastore: tokenizing",
               disable=not progress, file=sys.stderr)

    def flush():
        if not batch:
            return
        for ids in tokenizer(batch, add_special_tokens=True)["input_ids"]:
            if ids:  # an empty turn adds nothing (no BOS with it either)
                pieces.append(np.asarray(ids, dtype=np.int32))
                lengths.append(len(ids))
        bar.update(sum(len(text.encode("utf-8")) for text in batch))
        batch.clear()

    for record in iter_records(path, stats=stats):
        if max_conversations is not None and conversations >= max_conversations:
            break
        conversations += 1
        for text in conversation_turns(record):
            turns += 1
            batch.append(text)
        if len(batch) >= TOKENIZE_BATCH:
            flush()
    flush()
    bar.close()
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
    starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
    corpus_info = {"conversations": conversations, "turns": turns,
                   "truncated_tail": bool(stats.get("truncated"))}
    return tokens, starts, corpus_info


def build_datastore(tokenizer, corpus: Optional[str] = None, max_conversations: Optional[int] = None,
                    out_dir: Optional[str | os.PathLike] = None, progress: bool = True) -> Path:
    """Build (or find already built) the datastore of `corpus` for `tokenizer`; return its folder."""
    tok_hash = tokenizer_hash(tokenizer)
    options = {"format": FORMAT_VERSION, "max_conversations": max_conversations, "add_special_tokens": True}
    with corpus_path(corpus) as path:
        corpus_hash = file_sha256(path)
        folder = Path(out_dir).expanduser() if out_dir else default_datastore_dir(tok_hash, corpus_hash, options)
        manifest_file = folder / "manifest.json"
        if manifest_file.is_file():
            manifest = json.loads(manifest_file.read_text())
            if (manifest.get("tokenizer_sha256"), manifest.get("corpus_sha256"), manifest.get("options")) == (
                tok_hash, corpus_hash, options):
                return folder
        started = time.perf_counter()
        tokens, starts, corpus_info = _tokenize_corpus(tokenizer, path, max_conversations, progress)
        tokenize_seconds = time.perf_counter() - started
        if progress:
            print(f"REST datastore: suffix array over {len(tokens):,} tokens ...", file=sys.stderr, flush=True)
        sa = suffix_array(tokens)
        total_seconds = time.perf_counter() - started

        folder.mkdir(parents=True, exist_ok=True)
        # Write into a temporary folder beside the target, then move the files: a crash leaves no half datastore.
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            for name, array in zip(FILES, (tokens, starts, sa)):
                np.save(Path(tmp) / name, array, allow_pickle=False)
            manifest = {
                "format": FORMAT_VERSION,
                "tokenizer_sha256": tok_hash,
                "tokenizer_name": Path(str(getattr(tokenizer, "name_or_path", ""))).name,
                "corpus": path.name,
                "corpus_sha256": corpus_hash,
                "options": options,
                **corpus_info,
                "entries": int(len(starts) - 1),
                "tokens": int(len(tokens)),
                "max_token_id": int(tokens.max()) if len(tokens) else -1,
                "files": {name: file_sha256(Path(tmp) / name) for name in FILES},
            }
            (Path(tmp) / "build.json").write_text(json.dumps({
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "tokenize_seconds": round(tokenize_seconds, 1),
                "build_seconds": round(total_seconds, 1),
                "bytes": sum((Path(tmp) / name).stat().st_size for name in FILES),
            }, indent=1) + "\n")
            for name in (*FILES, "build.json"):
                os.replace(Path(tmp) / name, folder / name)
            # The manifest goes last: its presence marks a complete datastore.
            manifest_file.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        if progress:
            print(f"REST datastore: {len(tokens):,} tokens, {corpus_info['conversations']:,} conversations, "
                  f"{total_seconds:.0f} s -> {folder}", file=sys.stderr, flush=True)
    return folder


# ----------------------------------------------------------------------------------------------- load
@dataclass
class Datastore:
    tokens: np.ndarray  # int32 [n], memory-mapped
    starts: np.ndarray  # int64 [entries + 1]
    sa: np.ndarray  # int32/int64 [n], memory-mapped
    manifest: dict
    folder: Path


def load_datastore(folder: str | os.PathLike, tokenizer) -> Datastore:
    """Open a built datastore; refuse one built with another tokenizer."""
    folder = Path(folder).expanduser()
    manifest_file = folder / "manifest.json"
    if not manifest_file.is_file():
        raise HarnessError(f"no REST datastore at {folder} (manifest.json missing): build it with "
                           f"`python -m baselines.rest_datastore`")
    manifest = json.loads(manifest_file.read_text())
    expected = tokenizer_hash(tokenizer)
    if manifest.get("tokenizer_sha256") != expected:
        raise HarnessError(f"REST datastore {folder} was built with another tokenizer "
                           f"({str(manifest.get('tokenizer_sha256'))[:16]}, this model's is {expected[:16]}): "
                           f"rebuild it for this model")
    tokens = np.load(folder / "tokens.npy", mmap_mode="r")
    sa = np.load(folder / "sa.npy", mmap_mode="r")
    starts = np.load(folder / "starts.npy")
    return Datastore(tokens=tokens, starts=starts, sa=sa, manifest=manifest, folder=folder)
