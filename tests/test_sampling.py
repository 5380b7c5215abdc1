"""Temperature > 0: the engine's acceptance rule keeps the target's distribution for every method (proved by
goodness of fit against an enumerated distribution, with a biased rule shown to fail the same test), the
processed distribution matches transformers' logits processors, and on the real model sampling runs, stops,
reproduces its seed and tends to greedy decoding as the temperature goes to 0."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from evaluation.tools import exactness
from evaluation.catalog import available_methods
from evaluation.engine import decode_turn
from evaluation.engine.sampling import Sampler, SamplingParams
from tests.conftest import compose_config
from tests.test_runner import QUESTIONS, small_config, write_questions

SAMPLES = 600  # per method: a few seconds each; the biased rule's p-value is then below 1e-100


@pytest.fixture(scope="module")
def tiny():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 16-token model: threads only add overhead
    lm = exactness.tiny_target()
    prompt = exactness.exactness_prompt(lm)
    yield lm, prompt, exactness.exact_distribution(lm, prompt, SamplingParams(temperature=1.0))
    torch.set_num_threads(threads)


def test_exact_distribution_is_a_distribution(tiny):
    _, _, exact = tiny
    assert exact.shape == (exactness.VOCAB,) * 3 and abs(exact.sum() - 1) < 1e-9 and exact.min() >= 0


@pytest.mark.parametrize("name", available_methods())
def test_every_method_samples_the_target_distribution(tiny, name):
    lm, prompt, exact = tiny
    result = exactness.check_method(name, lm, prompt, SamplingParams(temperature=1.0), SAMPLES, exact=exact)
    assert result.p_value > exactness.ALARM, result
    if name != "vanilla":  # the trees were really used: drafts were accepted
        assert result.mat > 1.05, result


def test_top_k_and_top_p_are_kept_exactly(tiny):
    lm, prompt, _ = tiny
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=8)
    result = exactness.check_method("recycling", lm, prompt, params, SAMPLES)
    assert result.p_value > exactness.ALARM and result.mat > 1.05, result


def test_the_check_rejects_a_biased_rule(tiny):
    """Accepting a draft when it equals an independent sample of its row (REST's rule) is biased on a real tree:
    the same test must reject it, or it could not have caught a bug."""
    lm, prompt, exact = tiny
    result = exactness.check_method("recycling", lm, prompt, SamplingParams(temperature=1.0), SAMPLES,
                                    rule="token_match", exact=exact)
    assert result.p_value < 1e-6, result


def test_sampled_drafts_accept_more_with_their_q_and_upstreams_rule_is_caught(tiny):
    """SpS's drafts sampled from the draft's q and verified with q (the default, checked above with every method)
    accept more than the same draft's argmax verified as deterministic (q = 1), which is exact too. Upstream's
    rule, argmax drafts verified with q as if sampled from it, over-accepts them: the check rejects it."""
    lm, prompt, exact = tiny
    params = SamplingParams(temperature=1.0)
    sampled = exactness.check_method("sps", lm, prompt, params, SAMPLES, exact=exact)
    argmax = exactness.check_method("sps,sampled_drafts=False", lm, prompt, params, SAMPLES, exact=exact)
    assert argmax.p_value > exactness.ALARM and sampled.mat > argmax.mat + 0.3, (sampled, argmax)
    upstream = exactness.check_method("sps,greedy_drafts_with_q=True", lm, prompt, params, SAMPLES, exact=exact)
    assert upstream.p_value < 1e-10 and upstream.mat > 1.05, upstream


def test_processed_distribution_matches_transformers_logits_processors():
    from transformers.generation.logits_process import (
        LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

    torch.manual_seed(0)
    logits = torch.randn(200) * 3
    for temperature, top_k, top_p in ((1.0, 0, 1.0), (0.6, 20, 1.0), (1.3, 0, 0.8), (0.8, 50, 0.5), (2.0, 5, 0.99)):
        processors = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
        if top_k:
            processors.append(TopKLogitsWarper(top_k))
        if top_p < 1:
            processors.append(TopPLogitsWarper(top_p))
        expected = torch.softmax(processors(None, logits[None].double())[0], dim=-1)
        ours = Sampler(SamplingParams(temperature, top_p, top_k)).probabilities(logits)
        assert torch.allclose(ours, expected, atol=1e-12), (temperature, top_k, top_p)


# ------------------------------------------------------------------------------------------- the real model
def method_configs() -> list[str]:
    """One config per method (its variants change what it drafts, not how the engine samples)."""
    from tests.test_runner import METHOD_CONFIGS

    return [name for name in METHOD_CONFIGS if name in available_methods()]


def build(lm, config_name: str):
    """The method of conf/method/<config_name>.yaml; trained drafts fall back to a random one when none is
    committed for the embedded model (the rule, not the draft, is under test)."""
    from evaluation.run.validation import method_spec

    from tests.test_runner import REQUIRED_OVERRIDES

    spec = method_spec(compose_config(f"method={config_name}", *REQUIRED_OVERRIDES.get(config_name, [])).method)
    cls, options = spec.cls, spec.options
    if hasattr(options, "draft") and options.draft is None and not cls.ready_for(lm.name):
        options = dataclasses.replace(options, draft="random")
    if hasattr(options, "heads") and options.heads is None and not cls.ready_for(lm.name):
        options = dataclasses.replace(options, heads="random")
    return cls(options, lm)


@pytest.fixture(scope="module")
def stops_often(lm):
    """The embedded model with "." as an extra stop token, so that sampled answers end inside the budget."""
    period = lm.tokenizer.encode(".", add_special_tokens=False)
    return dataclasses.replace(lm, stop_ids=lm.stop_ids | {period[-1]})


@pytest.mark.parametrize("config_name", method_configs())
def test_every_method_samples_on_real_prompts_and_tends_to_greedy(config_name, lm, stops_often, lossless_prompts,
                                                                  vanilla_reference):
    method = build(lm, config_name)
    sampler = Sampler(SamplingParams(temperature=1.0), seed=11)
    result = decode_turn(stops_often, method, lossless_prompts["q401"], 24, sampler=sampler)
    ids = result.new_ids
    assert 1 <= len(ids) <= 24 and sum(result.accept_lengths) == len(ids)
    prefill, *steps = result.accept_lengths
    assert prefill == (0 if method.prefill_stops_short else 1)  # a prefill stopped short commits nothing
    assert all(1 <= n <= method.max_nodes + 1 for n in steps)
    stops = [i for i, t in enumerate(ids) if t in stops_often.stop_ids]
    assert stops in ([], [len(ids) - 1])  # the turn ends at its first stop token, drafts after it dropped
    assert result.stop_reason == ("stop_token" if stops else "max_new_tokens")
    # A vanishing temperature is greedy decoding.
    cold = Sampler(SamplingParams(temperature=1e-5), seed=3)
    prompt = lossless_prompts["q81"]
    assert decode_turn(lm, method, prompt, 16, sampler=cold).new_ids == vanilla_reference(prompt, 16)


def test_a_seed_reproduces_its_tokens(lm, lossless_prompts):
    method = build(lm, "pld")
    prompt = lossless_prompts["q241"]

    def sample(seed):
        return decode_turn(lm, method, prompt, 16, sampler=Sampler(SamplingParams(temperature=1.0), seed)).new_ids

    first = sample(5)
    assert sample(5) == first
    assert sample(6) != first


def test_a_sampled_run_records_its_setting_and_the_report_names_the_check(lm, tmp_path):
    from evaluation.report.load import SAMPLED_CHECK
    from evaluation.report.markdown import build as build_report
    from evaluation.run import orchestrate

    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[1:])
    folders = {}
    for method in ("vanilla", "pld"):
        cfg = small_config(tmp_path, qfile, f"method={method}", "bench.temperature=1.0", "bench.top_k=50",
                           "run.seed=4")
        [folders[method]] = orchestrate.run(cfg)
    manifest = json.loads((folders["pld"] / "manifest.json").read_text())
    assert manifest["sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "seed": 4}
    # The same command again in a fresh folder gives the same tokens (seeded per question, not per run).
    again = small_config(tmp_path / "again", qfile, "method=pld", "bench.temperature=1.0", "bench.top_k=50",
                         "run.seed=4")
    [folder] = orchestrate.run(again)
    ids = [[json.loads(line)["choices"][0]["token_ids"] for line in (f / "answers.jsonl").read_text().splitlines()]
           for f in (folders["pld"], folder)]
    assert ids[0] == ids[1]
    # A greedy run of the same slice is another comparison; the sampled block names the statistical check.
    [greedy] = orchestrate.run(small_config(tmp_path, qfile, "method=vanilla"))
    assert greedy.name != folders["vanilla"].name
    _, markdown = build_report(tmp_path / "runs", tmp_path / "report")
    assert "temperature 1" in markdown and SAMPLED_CHECK in markdown


@pytest.mark.parametrize("override, message", [
    ("bench.temperature=-1", "bench.temperature"), ("bench.temperature=1e-9", "bench.temperature"),
    ("bench.top_p=0.9", "unless temperature > 0"), ("bench.top_k=-2", "bench.top_k"),
])
def test_bad_sampling_options_are_refused(override, message):
    from evaluation.engine.errors import HarnessError
    from evaluation.run.validation import validate

    with pytest.raises(HarnessError, match=message.replace(".", r"\.")):
        validate(compose_config(override))
