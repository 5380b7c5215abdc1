"""The side-by-side tool's own logic (the tool itself installs a second environment and is run by hand)."""

from __future__ import annotations

import json

from evaluation.tools.upstream_parity import TREES, compare, first_difference, run_ours, side_model


def test_accept_lengths_line_up_as_both_loops_count_them():
    upstream = [3, 1, 4, 2, 5]
    assert first_difference([3, 1, 4], [2, 5], upstream, learns_past=True) is None
    assert first_difference([3, 1, 2], [2, 5], upstream, learns_past=True) is None  # our last step cut short
    assert first_difference([3, 2, 4], [2, 5], upstream, learns_past=True) == 1
    assert first_difference([3, 1, 4], [2], upstream, learns_past=True) == 4  # upstream took a step more
    assert first_difference([3, 1, 4], [2, 6], upstream, learns_past=True) == 4
    assert first_difference([3, 1, 4], [], upstream, learns_past=False) is None  # nothing carried: ignored
    assert first_difference([3, 1, 4, 2, 5, 1], [], upstream, learns_past=False) == 5
    # after a stop token upstream's step past it commits the stop token alone: compared by number only
    assert first_difference([3, 1, 4, 2], [3], upstream, learns_past=True, ended_at_stop=True) is None
    assert first_difference([3, 1, 4], [3], upstream, learns_past=True, ended_at_stop=True) == 4


def test_side_model_config_is_what_transformers_4_37_reads(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "llama", "dtype": "float32",
                                                    "rope_parameters": {"rope_theta": 100000.0}}))
    (source / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "TokenizersBackend"}))
    (source / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "merges": [["a", "b"], ["ab", "c"]]}}))
    folder = side_model(source, tmp_path / "scratch")
    config = json.loads((folder / "config.json").read_text())
    assert config["rope_theta"] == 100000.0 and config["torch_dtype"] == "float32"
    assert "rope_parameters" not in config and (folder / "model.safetensors").is_symlink()
    assert json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert json.loads((folder / "tokenizer.json").read_text())["model"]["merges"] == ["a b", "ab c"]


def test_our_side_records_what_upstream_records(lm, lossless_prompts):
    """Our side of the comparison on the real model: the fed ids in upstream's layout, and `compare` finding the
    first differing step (the upstream side needs a Spec-Bench clone and a second environment, so it is run by hand)."""
    prompt = lossless_prompts["q81"]
    for method in ("recycling", "lookahead"):
        ours = run_ours(lm, method, [prompt], 16)
        assert len(ours[0]["tokens"]) == 16 and len(ours[0]["fed"]) == TREES
        same = compare(method, ["q81"], ours, ours, 16)[0]
        assert same["tokens_identical"] and same["accept_lengths_identical"] and same["first_trees_identical"]
        theirs = [{**ours[0], "accept_lengths": list(ours[0]["accept_lengths"])}]
        theirs[0]["accept_lengths"][2] += 1
        assert compare(method, ["q81"], ours, theirs, 16)[0]["first_differing_step"] == 2
    # Lookahead's first window goes with upstream's prefill: the first recorded forward is window step 2, the
    # pending token then 8 + 9 window tokens in level order (no guesses yet).
    assert [len(fed) for fed in ours[0]["fed"]] == [1 + 8 + 9, 1 + 7 + 8 + 8]
