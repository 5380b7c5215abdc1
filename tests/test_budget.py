"""The draft budget: the selection against brute force, pruning, the acceptance and latency models, the cached
calibration, replayed curves, and losslessness of every method with the budget on."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evaluation.report import figures
from evaluation.report.load import load_runs
from evaluation.report.stats import summarize
from evaluation.run import orchestrate
from evaluation.catalog import method_class
from evaluation.engine.budget import (AcceptanceModel, DraftBudget, LatencyCurve, best_subtree, calibrate,
                                      check_curve_table, prune)
from evaluation.engine.tree import DraftTree, SideNodes
from evaluation.engine.errors import HarnessError
from tests.conftest import THREE
from tests.test_runner import QUESTIONS, small_config, write_questions

# Latency curves of different shapes: a GPU-like flat one, this CPU's measured one (ms, results/engine), a steep one.
FLAT = LatencyCurve([1, 64, 128], [0.020, 0.021, 0.024])
CPU = LatencyCurve([1, 2, 4, 8, 16, 32, 64], [0.085, 0.137, 0.140, 0.150, 0.159, 0.184, 0.230])
STEEP = LatencyCurve([1, 2], [1.0, 2.0])  # t(k) = k: a draft token costs as much as a step


def random_tree(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Parents (node 0 = -1) of a random tree of n draft nodes, and path probabilities from random conditionals."""
    parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n + 1)])
    conditional = rng.uniform(0, 1, n + 1) ** rng.uniform(0.3, 3)
    p = np.ones(n + 1)
    for i in range(1, n + 1):
        p[i] = p[parents[i]] * conditional[i]
    return parents, p[1:]


def brute_force(parents: np.ndarray, p: np.ndarray, latency, side: int = 0, fixed: float = 0.0) -> float:
    """The best rate over every subtree closed under parents, the empty one included."""
    n = len(p)
    best = 1.0 / (fixed + float(latency(1 + side)))
    for mask in itertools.product([False, True], repeat=n):
        kept = [i + 1 for i in range(n) if mask[i]]
        if all(parents[i] == 0 or mask[parents[i] - 1] for i in kept):
            best = max(best, (1 + sum(p[i - 1] for i in kept)) / (fixed + float(latency(1 + side + len(kept)))))
    return best


@pytest.mark.parametrize("latency", [FLAT, CPU, STEEP], ids=["flat", "cpu", "steep"])
def test_selection_equals_brute_force_over_subtrees(latency):
    rng = np.random.default_rng(0)
    for trial in range(150):
        parents, p = random_tree(rng, int(rng.integers(1, 11)))
        side = int(rng.integers(0, 3)) if trial % 3 == 0 else 0
        fixed = float(latency(1)) * rng.uniform(0, 2) if trial % 2 else 0.0  # drafting and the rest of the step
        kept = best_subtree(p, parents, latency, side, fixed)
        assert all(parents[i] == 0 or parents[i] in kept for i in kept)  # a node only with its parent
        rate = (1 + p[kept - 1].sum()) / (fixed + float(latency(1 + side + len(kept))))
        assert rate == pytest.approx(brute_force(parents, p, latency, side, fixed), rel=1e-12, abs=0)


@pytest.mark.parametrize("latency", [FLAT, CPU, STEEP], ids=["flat", "cpu", "steep"])
def test_selection_for_the_run_rate_equals_brute_force_over_subtrees(latency):
    """With the run's rate R, each step keeps the subtree of the most expected tokens less R times its time."""
    rng = np.random.default_rng(1)
    for trial in range(150):
        parents, p = random_tree(rng, int(rng.integers(1, 11)))
        fixed = float(latency(1)) * rng.uniform(0, 2) if trial % 2 else 0.0
        run_rate = rng.uniform(0.5, 2.5) / float(latency(1))
        kept = best_subtree(p, parents, latency, 0, fixed, run_rate)
        assert all(parents[i] == 0 or parents[i] in kept for i in kept)

        def value(nodes):
            return 1 + sum(p[i - 1] for i in nodes) - run_rate * (fixed + float(latency(1 + len(nodes))))

        best = max(value([i + 1 for i in range(len(p)) if mask[i]])
                   for mask in itertools.product([False, True], repeat=len(p))
                   if all(parents[i + 1] == 0 or mask[parents[i + 1] - 1] for i in range(len(p)) if mask[i]))
        assert value(kept) == pytest.approx(best, rel=1e-12, abs=1e-12)
    # Where the two objectives part: a run committing at half a plain step's rate (its other steps draft little)
    # gains from a step that keeps more than its own best rate would; an unlikely lone node is not worth its time.
    parents, p = np.array([-1, 0, 1]), np.array([0.9, 0.3])
    linear = LatencyCurve([1, 2], [1.0, 1.5])  # t = 1, 1.5, 2
    assert best_subtree(p, parents, linear).tolist() == [1]  # own rate: 1.9 / 1.5 = 1.27 beats 2.2 / 2 = 1.1
    assert best_subtree(p, parents, linear, run_rate=0.5).tolist() == [1, 2]  # 2.2 - 1 beats 1.9 - 0.75
    assert best_subtree(np.array([0.3]), np.array([-1, 0]), linear, run_rate=1.0).tolist() == []  # 1.3 - 1.5 < 0


def test_hand_made_cases():
    parents = np.array([-1, 0, 1, 0])  # a chain of two below the root, and a second child of the root
    p = np.array([0.9, 0.72, 0.05])
    assert best_subtree(p, parents, FLAT).tolist() == [1, 2, 3]  # nearly free: keep everything
    assert best_subtree(p, parents, STEEP).tolist() == []  # (1 + p) / 2 < 1 for any p < 1: draft nothing
    # t = 1, 1.5, 2.0, 2.5: one node (1.9 / 1.5 = 1.27) loses to two (2.62 / 2.0 = 1.31), three lose (2.67 / 2.5).
    linear = LatencyCurve([1, 2], [1.0, 1.5])
    assert best_subtree(p, parents, linear).tolist() == [1, 2]
    # Time paid whatever is kept (the drafting, the rest of the step) makes nodes cheaper by comparison:
    # on STEEP nothing pays alone, but once a step costs 3 more the chain of two does (2.62 / 6 > 1.9 / 5 > 1 / 4,
    # and the third node would not: 2.67 / 7).
    assert best_subtree(p, parents, STEEP, fixed_seconds=3.0).tolist() == [1, 2]
    # Ties at equal probability go to the earlier node, its parent first.
    assert best_subtree(np.array([0.5, 0.5, 0.5]), np.array([-1, 0, 1, 1]), LatencyCurve([1, 2], [1.0, 1.4])
                        ).tolist() == [1, 2, 3]


def test_prune_renumbers_tree_and_side_nodes():
    tree = DraftTree([10, 11, 12, 13], [0, 1, 0, 3], SideNodes([20, 21], [1, 2], [[0, 5], [0, 5, 6]]),
                     scores=[0.9, 0.8, 0.1, 0.05], sources=[3, 3, 5, 6])
    kept = prune(tree, np.array([1, 2]))
    assert kept.tokens == [10, 11] and kept.parents == [0, 1] and kept.scores == [0.9, 0.8]
    assert kept.sources == [3, 3]
    assert kept.side.tokens == [20, 21] and kept.side.sees == [[0, 3], [0, 3, 4]]  # side nodes move up by two


def test_acceptance_model_learns_and_scores_separate():
    model = AcceptanceModel()
    parents, depths = np.array([-1, 0, 0]), np.array([0, 1, 1])
    prior = model.path_probabilities(parents, depths, None)
    assert prior[0] > prior[1] > 0  # the first sibling is the likelier
    for _ in range(200):  # the first child is always right, the second never
        model.observe(parents, depths, None, np.array([5, 7, 8]), [7, 0])
    learned = model.path_probabilities(parents, depths, None)
    assert learned[0] > 0.95 and learned[1] < 0.05
    scored = AcceptanceModel()
    for _ in range(100):  # a high score is accepted, a low one is not, at the same depth and rank
        scored.observe(np.array([-1, 0]), np.array([0, 1]), np.array([0.9]), np.array([5, 7]), [7, 0])
        scored.observe(np.array([-1, 0]), np.array([0, 1]), np.array([0.1]), np.array([5, 7]), [6])
    # A node below the committed chunk reveals nothing; a cut node that matches the committed tokens counts.
    before = scored.tested.copy()
    scored.observe(np.array([-1, 0, 1]), np.array([0, 1, 2]), None, np.array([5, 7, 9]), [7])
    assert np.count_nonzero(scored.tested != before) == 1  # one bucket learned (depth 1), none below it
    high, low = (scored.path_probabilities(np.array([-1, 0]), np.array([0, 1]), np.array([s]))[0] for s in (0.9, 0.1))
    assert high > 0.9 and low < 0.1


def test_acceptance_separates_sources_and_nodes_without_a_score():
    """Two nodes alike in depth, rank and score but drafted by different sources (LogitSpec: a 3-gram match and a
    1-gram one) learn apart; a node whose score is None shares the no-score bucket, not the lowest scores'."""
    model = AcceptanceModel(memory=1.0)
    one = (np.array([-1, 0]), np.array([0, 1]), None, np.array([5, 7]))
    for _ in range(100):
        model.observe(*one, [7], np.array([3]))  # source 3: always right
        model.observe(*one, [8], np.array([1]))  # source 1: never
    strong, weak = (model.path_probabilities(one[0], one[1], None, np.array([c]))[0] for c in (3, 1))
    assert strong > 0.95 and weak < 0.05
    assert model.path_probabilities(one[0], one[1], None)[0] == pytest.approx(0.5)  # source 0 learned nothing

    scored = AcceptanceModel(memory=1.0)
    for _ in range(100):
        scored.observe(one[0], one[1], np.array([0.05]), one[3], [8])  # a low score: never right
        scored.observe(one[0], one[1], np.array([np.nan]), one[3], [7])  # no score: always right
    unscored = scored.path_probabilities(one[0], one[1], np.asarray([None], dtype=float))[0]
    assert unscored > 0.95 and scored.path_probabilities(one[0], one[1], np.array([0.05]))[0] < 0.05


def test_acceptance_follows_a_change_of_question_within_dozens_of_steps():
    """500 steps where the first child is always right, then 60 where it never is (a new subtask): the fading
    counts believe the change; counts that never fade would still say 0.9."""
    parents, depths, tokens = np.array([-1, 0]), np.array([0, 1]), np.array([5, 7])
    fading, lasting = AcceptanceModel(), AcceptanceModel(memory=1.0)
    for model in (fading, lasting):
        for _ in range(500):
            model.observe(parents, depths, None, tokens, [7])
        for _ in range(60):
            model.observe(parents, depths, None, tokens, [8])
    assert fading.path_probabilities(parents, depths, None)[0] < 0.35
    assert lasting.path_probabilities(parents, depths, None)[0] > 0.85


def test_cut_nodes_are_judged_at_every_depth_once_the_turn_reveals_them():
    """A chain cut to nothing still teaches its deep nodes: they are judged against the tokens committed later."""
    budget = DraftBudget(STEEP, AcceptanceModel(memory=1.0))  # on this curve nothing pays: every proposal is cut
    tokens = [1, 2, 3]  # the pending token is 3; the turn goes on 4, 5, 6, one token a step
    kept, _ = budget.select(DraftTree.chain([4, 5, 9]), position=len(tokens))
    assert kept.tokens == []
    before = budget.acceptance.tested.copy()
    for token in (4, 5):
        tokens.append(token)
        budget.observe(tokens, True, 1, 1.0, 0.0, 1, 1.0)
    assert (budget.acceptance.tested - before).sum() == 0  # depth 3 is not known yet: the proposal waits
    tokens.append(6)
    budget.observe(tokens, True, 1, 1.0, 0.0, 1, 1.0)
    tested, accepted = budget.acceptance.tested - before, budget.acceptance.accepted
    assert tested[:3, 0, 0, 0].tolist() == [1, 1, 1]  # depths 1-3 judged: 4 and 5 right, 9 wrong
    assert (accepted - AcceptanceModel().accepted)[:3, 0, 0, 0].tolist() == [1, 1, 0]
    budget.select(DraftTree.chain([7, 8]), position=len(tokens))
    tokens.append(7)
    budget.end_turn(tokens)  # the turn ends after one more token: depth 1 is judged, depth 2 stays unknown
    assert (budget.acceptance.tested - before)[:2, 0, 0, 0].tolist() == [2, 1]


def _skip_and_resume(draft_seconds: float, losing_steps: int, committed_when_drafted: int = 1
                     ) -> tuple[list[int], float, float]:
    """Steps of 1 s plus drafting on a budget whose drafts are expected never to pay, then drafts nearly always
    right and free. Returns the steps that drafted while losing, the time spent beyond plain steps per step, and
    the gap between explorations at the end of the losing phase."""
    budget = DraftBudget(LatencyCurve([1, 2, 64], [1.0, 1.1, 2.0], online=False))
    chain = DraftTree.chain([5, 6, 7])
    budget.acceptance.accepted = 0.05 * budget.acceptance.tested  # drafts are rarely right

    def step(draft_seconds: float) -> bool:
        drafted = budget.wants_draft()
        if drafted:
            budget.select(chain, 0, draft_seconds)
        spent = draft_seconds if drafted else 0.0
        forward = float(budget.latency(4)) if drafted else 1.0
        committed = committed_when_drafted if drafted else 1
        budget.observe([0], drafted, committed, forward + spent, spent, 4 if drafted else 1, forward)
        return drafted

    assert budget.wants_draft()  # nothing known: draft
    decisions = [step(draft_seconds) for _ in range(losing_steps)]
    explored = [i for i, d in enumerate(decisions) if d]
    excess = sum(float(budget.latency(4)) + draft_seconds - 1.0 for _ in explored)
    gap = budget._explore_gap
    budget.acceptance.accepted = 0.95 * budget.acceptance.tested  # drafts turn out nearly always right, and free
    resumed = [step(0.0) for _ in range(budget.MAX_EXPLORE_GAP + 100)]
    assert all(resumed[-50:])  # the next exploration found it out and drafting went on
    return explored, excess / losing_steps, gap


def test_drafting_stops_when_it_does_not_pay_and_resumes_when_it_does():
    # Drafting costs five plain steps and never pays: a few explorations, further and further apart, whose cost
    # sizes the gap (not the doubling alone) so that they take about 1% of the time.
    explored, overhead, gap = _skip_and_resume(draft_seconds=5.0, losing_steps=3000)
    assert 0 < len(explored) <= 16
    gaps = [b - a for a, b in zip(explored, explored[1:]) if b - a > 1]
    assert gaps == sorted(gaps) and gaps[-1] > DraftBudget.DOUBLING_CAP
    assert overhead < 0.02
    # Drafting that costs a fifth of a plain step and loses: cheap explorations stay frequent (the
    # doubling's cap), so drafting resumes soon after it starts to pay.
    explored, overhead, gap = _skip_and_resume(draft_seconds=0.2, losing_steps=3000)
    assert gap == DraftBudget.DOUBLING_CAP and len(explored) > 3000 // (DraftBudget.DOUBLING_CAP + 2)
    # Dear explorations that commit as many tokens as they cost time (7 in 6 s) cost nothing on balance: their
    # time does not space them out either (the decision to draft is the expected rate's, not this).
    explored, overhead, gap = _skip_and_resume(draft_seconds=5.0, losing_steps=3000, committed_when_drafted=7)
    assert gap == DraftBudget.DOUBLING_CAP


def test_cheap_drafting_is_never_skipped_the_selection_keeps_nothing_instead():
    """Drafting that costs 0.1% of a step and loses: skipping would save nothing, so the method drafts every step,
    the selection keeps nothing, and nodes are kept the step after drafts start to pay (not at an exploration)."""
    budget = DraftBudget(LatencyCurve([1, 2, 64], [1.0, 1.1, 2.0], online=False))
    budget.acceptance.accepted = 0.05 * budget.acceptance.tested  # drafts are rarely right
    chain = DraftTree.chain([5, 6, 7])
    kept_sizes = []
    for i in range(400):
        assert budget.wants_draft()  # every step drafts although drafting does not pay
        if i == 300:
            budget.acceptance.accepted = 0.95 * budget.acceptance.tested  # drafts turn out nearly always right
        kept, _ = budget.select(chain, 0, 0.001)
        kept_sizes.append(len(kept.tokens))
        forward = float(budget.latency(1 + len(kept.tokens)))
        budget.observe([0], True, 1, forward + 0.001, 0.001, 1 + len(kept.tokens), forward)
    assert budget.gain < 1.0 or kept_sizes[-1] == 3
    assert set(kept_sizes[:300]) == {0} and set(kept_sizes[300:]) == {3}
    # The same losing drafts at a fifth of a step are skipped (test above): what decides is what skipping saves.
    budget = DraftBudget(LatencyCurve([1, 2, 64], [1.0, 1.1, 2.0], online=False))
    budget.acceptance.accepted = 0.05 * budget.acceptance.tested
    decisions = []
    for _ in range(50):
        drafted = budget.wants_draft()
        decisions.append(drafted)
        if drafted:
            budget.select(chain, 0, 0.2)
        budget.observe([0], drafted, 1, 1.2 if drafted else 1.0, 0.2 if drafted else 0.0, 1, 1.0)
    assert not all(decisions[5:])


def test_latency_curve_interpolates_learns_and_reads_files(tmp_path):
    curve = LatencyCurve([1, 4], [0.1, 0.4])
    assert float(curve(2)) == pytest.approx(0.2) and float(curve(8)) == pytest.approx(0.8)  # the last slope goes on
    for _ in range(200):
        curve.observe(4, 0.8)  # this machine turns out twice as slow at k = 4
    assert float(curve(4)) == pytest.approx(0.8, rel=0.05)
    # A machine 25% slower than at calibration, seen only at the widths a method verifies (4 to 16): the narrow
    # end, vanilla's one-token step included, slows down with them (most of the way), the shape stays.
    true = LatencyCurve([1, 4, 16], [0.125, 0.25, 0.5], online=False)
    curve = LatencyCurve([1, 4, 16], [0.1, 0.2, 0.4])
    for k in [4, 8, 16] * 150:
        curve.observe(k, float(true(k)))
    assert float(curve(1)) == pytest.approx(0.125, rel=0.08) and float(curve(1)) > 0.11
    assert float(curve(8)) == pytest.approx(float(true(8)), rel=0.02)
    path = tmp_path / "curve.csv"
    pd.DataFrame({"new_tokens": [1, 64], "median_ms": [20.0, 21.0], "model": ["smollm2-135m"] * 2}).to_csv(path)
    replayed = LatencyCurve.read(path, model="smollm2-135m")
    assert float(replayed(64)) == pytest.approx(0.021) and not replayed.online
    with pytest.raises(HarnessError, match="measured on model 'smollm2-135m', not 'vicuna-7b-v1.3'"):
        LatencyCurve.read(path, model="vicuna-7b-v1.3")
    (tmp_path / "bad.csv").write_text("k,ms\n1,2\n")
    with pytest.raises(HarnessError, match="missing columns"):
        LatencyCurve.read(tmp_path / "bad.csv")
    with pytest.raises(HarnessError, match="cannot be read"):
        LatencyCurve.read(tmp_path / "absent.csv")


def test_calibration_is_measured_once_then_cached(lm, tmp_path):
    first = calibrate(lm, tmp_path, repeats=1)
    assert first.source.startswith("calibrated") and "cached" not in first.source
    assert np.all(first.seconds > 0) and len(first.seconds) == len(first.new_tokens)  # kept as measured
    [cached_file] = (tmp_path / "latency").glob("*.csv")
    second = calibrate(lm, tmp_path)
    assert second.source.endswith("(cached)") and np.allclose(second.seconds, first.seconds)
    assert cached_file.is_file()


# A curve on which a node pays when its path is accepted more than about a quarter of the time: cuts happen.
MODERATE = LatencyCurve([1, 2, 128], [1.0, 1.25, 33.0])

# Method -> whether some drafts must survive the cut on these prompts. REST's matches are too rarely accepted here
# to pay on this curve, so the budget rightly verifies almost nothing of its trees; Token Recycling and SAM are
# here for their updates, which must map the verified nodes back to the proposed ones (`proposed_index`).
# Lookahead's window alone costs about five plain steps on this curve, so drafting may stop altogether (None);
# its pruned trees with side nodes are checked in `test_every_method_is_lossless_when_drafting_is_skipped`.
BUDGET_METHODS = {"pld": True, "lookahead": None, "rest": False, "logitspec": True, "recycling": False, "sam": False,
                  "sps-self": False}


@pytest.mark.parametrize("name", BUDGET_METHODS)
def test_every_method_with_the_budget_is_lossless(lm, assert_lossless, name):
    budget = DraftBudget(LatencyCurve(MODERATE.new_tokens, MODERATE.seconds, online=False))
    cls = method_class(name)
    results = assert_lossless(cls(cls.Config(), lm), names=THREE, budget=budget)
    proposed = sum(sum(r.proposed_nodes) for r in results.values())
    verified = sum(sum(r.verified_nodes) for r in results.values())
    assert verified < proposed or (BUDGET_METHODS[name] is None and verified == proposed == 0)  # the budget did cut
    if BUDGET_METHODS[name]:  # and kept what pays
        assert sum(len(r.new_ids) for r in results.values()) > sum(r.steps for r in results.values())


class SkipEvery(DraftBudget):
    """A budget that skips drafting on steps 2 and 3 of every 4 (two in a row), whatever it has learned."""

    def __init__(self):
        super().__init__(LatencyCurve(MODERATE.new_tokens, MODERATE.seconds, online=False))
        self.step = 0

    def wants_draft(self) -> bool:
        self.step += 1
        return self.step % 4 in (0, 1)


@pytest.mark.parametrize("name", ["pld", "lookahead", "rest", "logitspec", "recycling", "sam", "gumiho", "eagle2"])
def test_every_method_is_lossless_when_drafting_is_skipped(lm, assert_lossless, name):
    """A skipped step calls `update` without `draft`: the methods that keep state from their last draft (Lookahead's
    window, Token Recycling's and SAM's verified tokens, Gumiho's pending hidden states) must stay in step."""
    cls = method_class(name)
    results = assert_lossless(cls(cls.Config(), lm), names=("q81-turn2", "q321"), budget=SkipEvery())
    proposed = [n for r in results.values() for n in r.proposed_nodes]
    assert proposed.count(0) >= len(proposed) // 2  # the skipped steps proposed nothing
    if name in ("pld", "logitspec", "gumiho"):  # and the verified drafts are still right often (a method out of
        # step after skipped steps drafts from the wrong place, and its drafts are next to never accepted)
        accepted = sum(len(r.new_ids) - r.steps for r in results.values())
        verified = sum(sum(r.verified_nodes) for r in results.values())
        assert verified > 20 and accepted > 0.15 * verified


def test_runner_records_proposed_and_verified_nodes(lm, tmp_path):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[:2])
    curve = tmp_path / "curve.csv"
    pd.DataFrame({"new_tokens": MODERATE.new_tokens, "median_ms": MODERATE.seconds * 1000}).to_csv(curve)
    for extra in ([], ["run.draft_budget=auto", f"run.latency_curve={curve}"]):
        for method in ("vanilla", "pld"):
            orchestrate.run(small_config(tmp_path, qfile, f"method={method}", "bench.max_new_tokens=24", *extra))
    df = load_runs(tmp_path / "runs")
    budgeted = "pld,draft_budget=auto,replayed_curve"
    assert sorted(df.method_label.unique()) == ["pld", budgeted, "vanilla"]
    folder = Path(df[df.method_label == budgeted].run_dir.iloc[0])
    assert json.loads((folder / "manifest.json").read_text())["draft_budget"]["latency"].startswith("replayed")
    choice = json.loads((folder / "answers.jsonl").read_text().splitlines()[0])["choices"][0]
    assert len(choice["verified_nodes"]) == len(choice["accept_lengths"]) - len(choice["turns"])
    assert all(v <= p for v, p in zip(choice["verified_nodes"], choice["proposed_nodes"]))
    overall = summarize(df).query("subtask == 'overall'").set_index("method_label")
    assert overall.loc["vanilla", "verified_per_step"] == 0
    assert overall.loc[budgeted, "verified_per_step"] < overall.loc["pld", "proposed_per_step"]
    written = figures.build_all(tmp_path / "runs", tmp_path / "figures", published_csv=tmp_path / "absent.csv")
    pairs = pd.read_csv(next(p for p in written if p.name.startswith("budget_") and p.suffix == ".csv"))
    assert sorted(pairs.budget) == ["auto,replayed_curve", "off"] and set(pairs.method_label) == {"pld"}
    assert any(p.name.startswith("budget_") and p.suffix == ".png" for p in written)


@pytest.mark.parametrize("widths, times, problem", [
    ([1], [20.0], "at least two distinct widths"),
    ([1, 1], [20.0, 21.0], "at least two distinct widths"),
    ([2, 4], [20.0, 21.0], "k = 1 among them"),
    ([1, 1.5], [20.0, 21.0], "whole numbers"),
    ([1, 10**9], [20.0, 21.0], "whole numbers from 1 to 4097"),
    ([1, 2], [20.0, float("inf")], "finite"),
    ([1, 2], [20.0, float("nan")], "must be numbers"),
    ([1, 2], [20.0, -1.0], "finite, from"),
    ([1, 2], [1e-300, 1e-300], "finite, from"),
    ([1, 2], [1e300, 1e300], "finite, from"),
    ([1, 8, 64], [20.0, 30.0, 10.0], "falls from k = 8 to k = 64"),
])
def test_a_nonsense_latency_curve_is_refused(widths, times, problem):
    """Each case the fault probe saw accepted; a replayed file and a cached calibration are checked alike."""
    assert problem in check_curve_table(pd.DataFrame({"new_tokens": widths, "median_ms": times}))


def test_a_curve_that_dips_at_narrow_widths_is_a_measured_one():
    """CPUs measure an 8-token forward faster than a 1-token one (a wider product runs a faster kernel): kept."""
    assert check_curve_table(pd.DataFrame({"new_tokens": [1, 8, 64, 128], "median_ms": [62.9, 50.3, 70.0, 95.0]})) == ""
