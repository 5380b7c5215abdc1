"""REST: the datastore (reader, suffix array, determinism, tokenizer check), retrieval per step, and losslessness."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from baselines.rest import Rest, RestConfig, Retriever
from baselines.rest_datastore import build_datastore, load_datastore, suffix_array
from evaluation.corpus import iter_records
from evaluation.engine.errors import HarnessError

WORDS = "a again cat dog mat my on sat sofa the".split()  # alphabetical, so ids sort like the words


class WordTokenizer:
    """A word-level stand-in tokenizer: ids sort like the words, and sit past 255 so the suffix array sees
    multi-byte symbols."""

    name_or_path = "words"
    all_special_tokens: list[str] = []

    def __init__(self, words=WORDS, base=300):
        self.vocab = {w: base + 7 * i for i, w in enumerate(words)}

    def get_vocab(self):
        return dict(self.vocab)

    def encode(self, text):
        return [self.vocab[w] for w in text.split()]

    def __call__(self, texts, add_special_tokens=True):
        return {"input_ids": [self.encode(t) for t in texts]}


CONVERSATIONS = [
    ["the cat sat on the mat", "the cat sat on the sofa"],
    ["the cat sat on the mat again"],
    ["a dog sat on the mat"],
]


def write_corpus(path, conversations=CONVERSATIONS):
    records = [{"id": str(i), "conversations": [{"from": "human" if j % 2 == 0 else "gpt", "value": text}
                                                 for j, text in enumerate(turns)]}
               for i, turns in enumerate(conversations)]
    path.write_text(json.dumps(records, indent=1))
    return path


@pytest.fixture
def word_store(tmp_path):
    tokenizer = WordTokenizer()
    folder = build_datastore(tokenizer, str(write_corpus(tmp_path / "corpus.json")), out_dir=tmp_path / "ds",
                             progress=False)
    return tokenizer, load_datastore(folder, tokenizer)


def retriever(store, **options) -> Retriever:
    return Retriever(store, RestConfig(**options))


# ----------------------------------------------------------------------------------------------- corpus reader
def test_reader_stops_cleanly_at_a_truncated_tail(tmp_path):
    records = [{"id": i, "conversations": [{"from": "human", "value": f"é{i} " * (i + 3)}]} for i in range(5)]
    whole = json.dumps(records)
    cut = whole[: whole.index('{"id": 4') + 30]  # the last record broken mid-string
    path = tmp_path / "cut.json"
    path.write_text(cut, encoding="utf-8")
    for chunk in (5, 64, 1 << 20):  # small chunks split records and a 2-byte UTF-8 character
        stats = {}
        got = list(iter_records(path, chunk_chars=chunk, stats=stats))
        assert got == records[:4] and stats == {"records": 4, "truncated": True}
    path.write_text(whole)
    stats = {}
    assert list(iter_records(path, chunk_chars=7, stats=stats)) == records and not stats["truncated"]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")  # JSON lines
    assert list(iter_records(path, chunk_chars=9)) == records


# ----------------------------------------------------------------------------------------------- datastore
def test_suffix_array_is_plain_lexicographic_order():
    rng = np.random.default_rng(0)
    for vocab in (3, 300, 70000):
        tokens = rng.integers(0, vocab, 400).astype(np.int32)
        expected = sorted(range(len(tokens)), key=lambda i: tokens[i:].tolist())
        assert suffix_array(tokens).tolist() == expected
    assert suffix_array(np.array([5, 5, 5], np.int32)).tolist() == [2, 1, 0]


def test_datastore_layout(word_store):
    tokenizer, store = word_store
    assert store.manifest["conversations"] == 3 and store.manifest["entries"] == 4
    text = " ".join(t for turns in CONVERSATIONS for t in turns)
    assert store.tokens.tolist() == tokenizer.encode(text)
    assert store.starts.tolist() == [0, 6, 12, 19, 25]


def test_build_is_deterministic(lm, tmp_path):
    folders = [build_datastore(lm.tokenizer, max_conversations=40, out_dir=tmp_path / name, progress=False)
               for name in ("a", "b")]
    for name in ("tokens.npy", "starts.npy", "sa.npy", "manifest.json"):
        assert (folders[0] / name).read_bytes() == (folders[1] / name).read_bytes(), name
    assert json.loads((folders[0] / "manifest.json").read_text())["conversations"] == 40


def test_datastore_of_another_tokenizer_is_refused(word_store):
    _, store = word_store
    with pytest.raises(HarnessError, match="another tokenizer"):
        load_datastore(store.folder, WordTokenizer(base=1000))
    with pytest.raises(HarnessError, match="no REST datastore"):
        load_datastore(store.folder / "missing", WordTokenizer())


# ----------------------------------------------------------------------------------------------- retrieval
def test_longest_suffix_and_counted_continuations(word_store):
    tok, store = word_store
    ids = tok.vocab
    r = retriever(store, allow_cross_entry_matches=False)
    # "my" is not in the corpus, so the longest suffix found is "cat sat on the" (3 occurrences).
    span, conts = r.retrieve(tok.encode("my cat sat on the"))
    assert span == 4
    rows = sorted(tuple(int(t) for t in row if t >= 0) for row in conts)
    assert rows == sorted([(ids["mat"],), (ids["mat"], ids["again"]), (ids["sofa"],)])
    trie = r.trie(conts)
    counts = {tuple(int(t) for t in seq if t >= 0): int(c) for seq, c in zip(trie.sequences[1:], trie.counts[1:])}
    assert counts == {(ids["mat"],): 2, (ids["mat"], ids["again"]): 1, (ids["sofa"],): 1}
    # The tree: a trie in BFS order, parents first, each prefix once.
    tree = r.draft(tok.encode("my cat sat on the"))
    assert (tree.tokens, tree.parents) == ([ids["mat"], ids["sofa"]] + [ids["again"]], [0, 0, 1])
    # Across seams (upstream), the first turn's "mat" runs on into the next turn: "mat the cat ...".
    span, conts = retriever(store).retrieve(tok.encode("my cat sat on the"))
    assert span == 4 and (ids["mat"], ids["the"], ids["cat"]) in {tuple(row[:3].tolist()) for row in conts}
    # Nothing found: upstream's dummy child, or an empty draft.
    assert retriever(store).draft(tok.encode("my my")).tokens == [100]
    assert len(retriever(store, no_match_token=None).draft(tok.encode("my my"))) == 0


def test_budget_rules_and_tie_break(word_store):
    tok, store = word_store
    ids = tok.vocab
    context = tok.encode("my cat sat on the")
    # trie_nodes: the 2 most frequent prefixes; the tie at count 1 goes to the smaller sequence ("mat again").
    tree = retriever(store, allow_cross_entry_matches=False, prune="trie_nodes", num_draft=2).draft(context)
    assert (tree.tokens, tree.parents) == ([ids["mat"], ids["again"]], [0, 1])
    # distinct_tokens (upstream): {mat: 1, mat again: 2, sofa: 1} sums to 4 > 3, so the 2-token path goes.
    tree = retriever(store, allow_cross_entry_matches=False, num_draft=3).draft(context)
    assert (tree.tokens, tree.parents) == ([ids["mat"], ids["sofa"]], [0, 0])
    # max_occurrences bounds the continuations read.
    assert len(retriever(store, max_occurrences=2).retrieve(context)[1]) == 2
    assert len(retriever(store, max_occurrences=2, occurrence_choice="evenly_spaced").retrieve(context)[1]) == 2


@pytest.fixture(scope="module")
def sharegpt_store(tmp_path_factory):
    """A datastore of the first 300 ShareGPT conversations; `.ci/offline-check`, whose environment has neither the
    corpus nor the suffix-array package, names the offline bundle's prebuilt one instead."""
    from tests.conftest import _embedded_model

    if os.environ.get("SPECDEC_TEST_REST_DATASTORE"):
        return Path(os.environ["SPECDEC_TEST_REST_DATASTORE"])
    return build_datastore(_embedded_model().tokenizer, max_conversations=300,
                           out_dir=tmp_path_factory.mktemp("rest") / "ds", progress=False)


@pytest.mark.parametrize("options", [{}, {"prune": "trie_nodes", "occurrence_choice": "evenly_spaced",
                                         "allow_cross_entry_matches": False, "num_draft": 20}])
def test_trees_respect_the_budget(lm, lossless_prompts, sharegpt_store, options):
    method = Rest(RestConfig(datastore=str(sharegpt_store), **options), lm)
    sizes = []
    for prompt in lossless_prompts.values():
        for end in range(len(prompt) - 40, len(prompt) + 1, 4):
            tree = method.retriever.draft(prompt[:end])
            assert len(tree) <= method.max_nodes
            assert all(p < i + 1 for i, p in enumerate(tree.parents))
            assert len(set(zip(tree.parents, tree.tokens))) == len(tree)  # a trie: each prefix once
            sizes.append(len(tree))
    assert max(sizes) > 1


def test_lossless_against_vanilla(lm, assert_lossless, sharegpt_store):
    results = assert_lossless(Rest(RestConfig(datastore=str(sharegpt_store)), lm))
    tokens = sum(len(r.new_ids) for r in results.values())
    steps = sum(r.steps for r in results.values())
    assert tokens / steps > 1.05  # retrieval does get drafts accepted
