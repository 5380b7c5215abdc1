"""The pairing of targets with released checkpoints, and what uses it: every method resolves its trained part from
it, a bench plans every paired row, a run finds every checkpoint before the target loads (and stops at once, naming
all of them, without a network), `make reproduce-specbench` prints its plan, `make fetch-checkpoints` plans its
downloads."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from evaluation.catalog import bench_plan, catalog, config_method, import_class, model_name
from evaluation.checkpoints import kinds, markdown, pairing_table, released, targets
from evaluation.engine.errors import HarnessError
from evaluation.run import preflight
from evaluation.run.folder import run_identity
from evaluation.run.interleave import compose_cell
from evaluation.run.validation import validate
from evaluation.hub import HUB_ID
from tests.conftest import question_file

ROOT = Path(__file__).resolve().parent.parent
# Every leaderboard row Spec-Bench runs for Vicuna-7B that needs a checkpoint, and the one it pairs
VICUNA_7B = {"eagle": "yuhuili/EAGLE-Vicuna-7B-v1.3", "eagle2": "yuhuili/EAGLE-Vicuna-7B-v1.3",
             "medusa": "FasterDecoding/medusa-vicuna-7b-v1.3", "hydra": "ankner/hydra-vicuna-7b-v1.3",
             "gumiho": "amd/Gumiho-vicuna-7b", "sps": "double7/vicuna-68m"}


def test_the_pairing_table_names_real_targets_methods_and_hub_ids():
    for kind in kinds().values():
        for method in kind.methods:
            cls = import_class(config_method(method).target)
            assert cls.checkpoint_kind == kind.name and cls.checkpoint_option == kind.option, method
    trained = {name for name, entry in catalog().items()  # the methods that load a checkpoint by default
               if getattr(import_class(entry.target), "checkpoint_option", None)
               and getattr(import_class(entry.target).Config(), import_class(entry.target).checkpoint_option) is None}
    assert trained == {config_method(m).name for k in kinds().values() for m in k.methods}
    for entry in pairing_table():
        assert (ROOT / "conf" / "model" / f"{entry.target}.yaml").is_file(), entry
        assert HUB_ID.fullmatch(entry.hub_id) and entry.source.startswith("https://github.com/"), entry
    assert {"vicuna-7b-v1.3", "vicuna-13b-v1.3", "vicuna-33b-v1.3", "llama-2-7b-chat", "llama-2-13b-chat",
            "llama-3-8b-instruct", "llama-3.1-8b-instruct", "qwen3-8b"} == set(targets())
    assert released("vicuna-13b-v1.3", "eagle3").hub_id == "yuhuili/EAGLE3-Vicuna1.3-13B"
    assert released("vicuna-7b-v1.3", "eagle3") is None  # EAGLE-3 for Vicuna: 13B only
    assert released("llama-3.1-8b-instruct", "eagle3").hub_id == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"


def test_the_docs_show_the_table_as_it_is():
    assert markdown() in (ROOT / "docs" / "checkpoints.md").read_text()


def test_a_null_option_takes_the_committed_draft_else_the_released_one():
    for config_name, hub_id in VICUNA_7B.items():
        cls = import_class(config_method(config_name).target)
        assert cls.trained_source(cls.Config(), "vicuna-7b-v1.3") == hub_id, config_name
        named = cls.Config(**{cls.checkpoint_option: "/some/folder"})
        assert cls.trained_source(named, "vicuna-7b-v1.3") == "/some/folder"
    eagle = import_class(config_method("eagle").target)
    committed = eagle.trained_source(eagle.Config(), "smollm2-135m")  # the embedded model's own draft wins
    assert committed == str(ROOT / "eagle" / "drafts" / "eagle" / "smollm2-135m")
    assert eagle.trained_source(eagle.Config(draft="random"), "vicuna-7b-v1.3") is None
    eagle3 = import_class(config_method("eagle3").target)
    assert eagle3.trained_source(eagle3.Config(), "vicuna-7b-v1.3") is None
    assert "make train FAMILY=eagle3 MODEL=vicuna-7b-v1.3" in eagle3.unavailable_reason("vicuna-7b-v1.3")


def test_a_bench_plans_every_paired_row_and_says_why_it_leaves_one_out():
    for model, expected, absent in (("vicuna-7b", VICUNA_7B, {"eagle3"}),
                                    ("vicuna-13b", {**VICUNA_7B, "eagle3": None}, set()),
                                    ("llama-3.1-8b", {"eagle": None, "eagle3": None}, {"medusa", "hydra", "sps"}),
                                    ("qwen3-8b", {"eagle3": None}, {"eagle", "gumiho", "sps"})):
        settings, left_out = bench_plan(model)
        assert set(expected) <= set(settings) and not absent & set(settings), model
        assert absent <= set(left_out) and all(model_name(model) in left_out[m] for m in absent)
        assert {"pld", "logitspec", "recycling", "sps-self"} <= set(settings)


def cells_of(model: str, *extra: str) -> list:
    settings, _ = bench_plan(model)
    common = [f"model={model}", f"bench.question_file={question_file()}", "bench.questions_per_subtask=1", *extra]
    return [validate(compose_cell(f"method={name}", common)) for name in settings]


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    """An empty hub cache and the hub client offline, as on a node without a network."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hub"


def stand_in(hub: Path, hub_id: str) -> None:
    """A hub cache entry for `hub_id` as huggingface_hub lays one out (a snapshot with its config.json)."""
    snapshot = hub / f"models--{hub_id.replace('/', '--')}" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (hub / f"models--{hub_id.replace('/', '--')}" / "refs").mkdir()
    (hub / f"models--{hub_id.replace('/', '--')}" / "refs" / "main").write_text("0" * 40)


def test_offline_every_missing_checkpoint_is_named_at_once_in_seconds(empty_hub_cache):
    specs = cells_of("vicuna-7b")
    started = time.perf_counter()
    with pytest.raises(HarnessError) as error:
        preflight.check(specs, model="vicuna-7b")
    assert time.perf_counter() - started < 5
    message = str(error.value)
    assert "\n" not in message and message.startswith("6 missing before any model loads")
    for hub_id in {"lmsys/vicuna-7b-v1.3", *VICUNA_7B.values()}:
        assert hub_id in message
    assert "HF_HUB_OFFLINE=1" in message and "make fetch-checkpoints MODEL=vicuna-7b DEST=" in message
    # The same cells with everything in the cache: found, and the hub client is switched offline for the loads
    for hub_id in {"lmsys/vicuna-7b-v1.3", *VICUNA_7B.values()}:
        stand_in(empty_hub_cache, hub_id)
    assert {n.source for n in preflight.check(specs) if n.where == "hub"} == {"lmsys/vicuna-7b-v1.3",
                                                                               *VICUNA_7B.values()}
    from huggingface_hub import constants

    assert constants.HF_HUB_OFFLINE is True


def test_a_method_with_nothing_to_load_is_named_before_the_target_loads(empty_hub_cache):
    spec = validate(compose_cell("method=eagle3", [f"bench.question_file={question_file()}", "model=vicuna-7b"]))
    stand_in(empty_hub_cache, "lmsys/vicuna-7b-v1.3")
    with pytest.raises(HarnessError, match=r"^1 missing .*no EAGLE-3 draft committed or released for vicuna-7b-v1.3"):
        preflight.check([spec])


def test_a_run_with_a_released_checkpoint_is_its_own_run():
    [spec] = [s for s in cells_of("vicuna-7b") if s.method.name == "medusa"]
    model = SimpleNamespace(source="lmsys/vicuna-7b-v1.3", dtype="torch.float16", device=SimpleNamespace(type="cuda"))
    _, run = run_identity(spec, model, "sha", 0)
    assert run["checkpoint"] == "FasterDecoding/medusa-vicuna-7b-v1.3"
    [committed] = [s for s in cells_of("smollm2-135m") if s.method.name == "medusa"]
    assert "checkpoint" not in run_identity(committed, model, "sha", 0)[1]  # the committed heads: by content


def run_tool(*args: str, hub: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub)}
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)


def test_reproduce_specbench_prints_its_plan_then_refuses_offline_or_finds_everything(tmp_path, monkeypatch,
                                                                                       capsys):
    hub = tmp_path / "hub"
    done = run_tool("-m", "evaluation.tools.reproduce_specbench", "--model", "vicuna-7b", "--dry-run",
                    "--out", str(tmp_path / "out"), "--", f"bench.question_file={question_file()}", hub=hub)
    assert done.returncode == 2, done.stderr
    plan = done.stdout
    assert "target vicuna-7b-v1.3 (lmsys/vicuna-7b-v1.3)" in plan and "batch 1, greedy" in plan
    assert "every question of all six subtasks" in plan and "1024 new tokens" in plan and "3 warm-ups" in plan
    for method, hub_id in VICUNA_7B.items():
        assert any(line.split()[:2] == [method, hub_id] for line in plan.splitlines()), (method, plan)
    assert "leaves out eagle3" in plan and "estimated duration" in plan
    assert done.stderr.startswith("error: 6 missing before any model loads") and done.stderr.count("\n") == 1
    for hub_id in {"lmsys/vicuna-7b-v1.3", *VICUNA_7B.values()}:
        stand_in(hub, hub_id)
    from huggingface_hub import constants

    from evaluation.tools.reproduce_specbench import main

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    main(["--model", "vicuna-7b", "--dry-run", "--out", str(tmp_path / "out"), "--",
          f"bench.question_file={question_file()}"])
    assert "every checkpoint and file found" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_fetch_checkpoints_plans_the_target_and_each_paired_checkpoint_once(tmp_path, capsys):
    from evaluation.tools.fetch_checkpoints import plan, weight_patterns

    items = plan("vicuna-7b")
    assert [i.hub_id for i in items][0] == "lmsys/vicuna-7b-v1.3"
    assert sorted(i.hub_id for i in items[1:]) == sorted(set(VICUNA_7B.values()))
    assert [i.what for i in items if i.hub_id == VICUNA_7B["eagle"]] == ["eagle (eagle, eagle2)"]
    assert plan("smollm2-135m") == []  # the embedded model: its drafts are committed, nothing to fetch
    assert "*.safetensors" in weight_patterns(["model.safetensors", "pytorch_model.bin"])
    assert "*.bin" in weight_patterns(["pytorch_model.bin", "config.json"])
    from evaluation.tools.fetch_checkpoints import fetch

    fetch("vicuna-7b", tmp_path / "d", dry_run=True)
    out = capsys.readouterr().out
    assert all(hub_id in out for hub_id in VICUNA_7B.values()) and not (tmp_path / "d").exists()


def test_a_null_option_with_nothing_to_load_is_one_line_naming_the_fallback(lm):
    from baselines.sps import SelfSpeculative

    with pytest.raises(HarnessError, match=r"^no SpS draft model released for smollm2-135m \(.*\) \(or run method=sps-self\)$"):
        SelfSpeculative(SelfSpeculative.Config(draft_model=None), lm)
