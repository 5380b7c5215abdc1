"""Beyond one process: Ray workers, a cluster launcher's sweep, one writer per run folder, and what can be checked
of the CUDA path without a GPU (tensors built on the model's device, the KV cache per layer device, device maps).

One local Ray cluster of 2 CPUs serves the module; the slices are tiny (2 questions, 16 new tokens, no warm-up).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch

from evaluation.report.cli import main as report_main
from evaluation.run import orchestrate
from evaluation.run.folder import one_writer
from evaluation.engine.kv_cache import PositionalKVCache
from evaluation.engine.tree import DraftTree, SideNodes, ancestor_matrix, build_tree_inputs
from evaluation.engine.errors import HarnessError
from evaluation.run.validation import validate
from tests.conftest import ROOT, compose_config
from tests.test_runner import QUESTIONS, check_run_and_resume, small_config, write_questions

TINY = ("bench.max_new_tokens=16",)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, object_store_memory=80 * 2**20, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def answers_of(folder) -> dict:
    lines = [json.loads(line) for line in (folder / "answers.jsonl").read_text().splitlines()]
    return {line["question_id"]: line["choices"][0]["token_ids"] for line in lines}


def test_ray_workers_answer_as_one_process_does_and_resume_after_a_kill(ray_cluster, lm, tmp_path):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[:2])
    [single] = orchestrate.run(small_config(tmp_path / "one", qfile, *TINY))
    # The resume test of tests/test_runner.py, through 2 Ray workers: each question written once, a cut-off last
    # line redone by the next run's workers, nothing redone once finished.
    folder, lines = check_run_and_resume(small_config(tmp_path / "ray", qfile, *TINY, "run.workers=2"), [1, 2])
    assert folder.name == single.name  # the same run identity: workers change who answers, not what
    assert {line["question_id"]: line["choices"][0]["token_ids"] for line in lines} == answers_of(single)
    manifest = json.loads((folder / "manifest.json").read_text())
    [worker] = manifest["workers"]  # the resumed run started one worker for its one question left
    assert worker["index"] == 0 and worker["device"] == "cpu" and worker["torch_threads"] == 1 and worker["pid"]
    assert {line["worker"] for line in lines} <= {0, 1}
    assert manifest["environment"]["command"] == " ".join(sys.argv)  # the driver's, not a Ray worker's


def test_a_worker_that_cannot_load_stops_the_run_in_one_line(ray_cluster, lm, tmp_path):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[:2])
    with pytest.raises(HarnessError, match="question 1: prompt of .* tokens does not fit the context of 20") as caught:
        orchestrate.run(small_config(tmp_path, qfile, "model.max_context=20", "run.workers=1"))
    assert "\n" not in str(caught.value) and not (tmp_path / "runs").exists()


def test_a_hung_worker_is_timed_out_killed_and_replaced(ray_cluster, lm, tmp_path, monkeypatch):
    """One worker that never answers question 2: after run.question_timeout_s that question is an error record
    naming the timeout, the worker is killed, a fresh one answers question 3, and the run ends."""
    from evaluation.run.ray_workers import RayWorkers, Worker

    class HangsOnQuestion2(Worker):  # defined in the test: Ray ships the class to its worker by value
        def answer(self, question):
            if question.question_id == 2:
                time.sleep(3600)  # a forward that never returns (a deadlocked kernel, a stuck collective)
            return Worker.answer(self, question)

    monkeypatch.setattr(RayWorkers, "worker_class", HangsOnQuestion2)
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS)
    began = time.monotonic()
    [folder] = orchestrate.run(small_config(tmp_path, qfile, "run.workers=1", "run.question_timeout_s=10"))
    assert time.monotonic() - began < 600  # far below the hung answer's hour (about 25 s on a quiet machine)
    lines = {line["question_id"]: line for line in map(json.loads, (folder / "answers.jsonl").read_text().splitlines())}
    assert sorted(lines) == [1, 2, 3]
    hung = lines[2]
    assert hung["status"] == "error" and hung["error"] == "TimeoutError: no answer after 10 s on worker 0"
    assert hung["choices"] == [] and hung["worker"] == 0 and hung["category"] == "qa" and hung["subtask"] == "qa"
    assert set(hung) == set(lines[1])  # the fields of every answer line
    assert (lines[1]["status"], lines[1]["worker"]) == ("ok", 0)
    assert (lines[3]["status"], lines[3]["worker"]) == ("ok", 1)  # the worker started in place of the hung one


@pytest.mark.parametrize("overrides, message", [
    (["run.gpus_per_worker=1"], "run.gpus_per_worker: 1.0 (allowed: null unless run.workers is set)"),
    (["run.ray_address=auto"], "run.ray_address: 'auto' (allowed: null unless run.workers is set)"),
    (["run.workers=0"], "run.workers: 0 (allowed: an integer in [1, 4096])"),
    (["run.workers=2", "run.device=cuda:1"], "run.device: 'cuda:1'"),
    (["run.workers=2", "run.ray_address=no address"], "run.ray_address: 'no address' (allowed: auto, host:port"),
    (["model.device_map=everywhere"], "model.device_map: 'everywhere' (allowed: null, auto, balanced"),
    (["model.device_map={lm_head: gpu7}"], "model.device_map.lm_head: 'gpu7'"),
])
def test_worker_and_device_map_options_are_checked_in_one_line(overrides, message):
    with pytest.raises(HarnessError) as caught:
        validate(compose_config(*overrides))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_without_workers_ray_is_never_imported():
    code = ("import sys, run\n"
            "from hydra.core.plugins import Plugins\nfrom hydra.plugins.launcher import Launcher\n"
            "Plugins.instance().discover(Launcher)  # the cluster launchers' plugins are scanned, not imported\n"
            "from evaluation.run import orchestrate\n"
            "assert 'ray' not in sys.modules and 'submitit' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_submitit_sweep_writes_one_folder_per_cell_and_the_report_combines_them(lm, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[:2])
    command = [sys.executable, "run.py", "-m", "hydra/launcher=submitit_local", "method=vanilla,pld",
               f"bench.question_file={qfile}", *TINY, "bench.warmup=0", f"run.results_dir={tmp_path / 'runs'}",
               f"hydra.sweep.dir={tmp_path / 'sweep'}", "model.dtype=float32", "run.device=cpu", "run.progress=false",
               "hydra.launcher.cpus_per_task=1"]
    # Both jobs run at once on this machine's cores: one thread each.
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    folders = sorted((tmp_path / "runs" / "smollm2-135m").iterdir())
    assert [f.name.split("-")[0] for f in folders] == ["pld", "vanilla"]
    report_main(["--results", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    overall = pd.read_csv(tmp_path / "out" / "report.csv").query("subtask == 'overall'")
    assert sorted(overall.method_label) == ["pld", "vanilla"] and (overall.questions == 2).all()
    assert pd.read_csv(tmp_path / "out" / "lossless.csv").equal.tolist() == [True, True]


def test_one_writer_per_run_folder(lm, tmp_path):
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[1:2])
    cfg = small_config(tmp_path, qfile, "bench.max_new_tokens=2")
    [folder] = orchestrate.run(cfg)
    with one_writer(folder):  # another process writing this run, as the same sweep cell launched twice
        with pytest.raises(HarnessError, match="is being written by another process") as caught:
            orchestrate.run(cfg)
    assert "\n" not in str(caught.value)
    assert orchestrate.run(cfg) == [folder]  # the lock goes with its holder


# ------------------------------------------------------------------------ the CUDA path, checked on the CPU
def test_tree_inputs_are_built_on_the_model_device_with_one_small_copy(monkeypatch):
    """On the `meta` device (no data, as far from the host as a GPU): ids, positions and mask end up there, and
    the only host-to-device copy is ids + positions + the tree's visibility, nothing that grows with the context."""
    copies = []
    to = torch.Tensor.to

    def spy(tensor, *args, **kwargs):
        moved = to(tensor, *args, **kwargs)
        if tensor.device.type == "cpu" and moved.device.type != "cpu":
            copies.append(tensor.numel())
        return moved

    monkeypatch.setattr(torch.Tensor, "to", spy)
    device = torch.device("meta")
    tree = DraftTree([11, 12, 13, 14, 15], [0, 0, 1, 1, 2], side=SideNodes([8, 9], [1, 2], [[0, 6], [0, 6, 7]]))
    for cache_length in (5000, 5003, 9000):
        copies.clear()
        inputs = build_tree_inputs(10, tree, cache_length, torch.float16, device)
        assert {t.device for t in (inputs.input_ids, inputs.position_ids, inputs.attention_mask)} == {device}
        assert inputs.attention_mask.shape == (1, 1, 8, cache_length + 8)
        assert inputs.attention_mask.dtype == torch.float16
        assert copies == [2 * 8 + 8 * 8]


def test_the_reused_mask_buffer_gives_the_plain_mask_at_every_step():
    """Trees of random sizes over a growing cache (the buffer grows and is reused): each step's mask equals the
    one built from scratch, including steps inside inference mode and outside it."""
    rng = random.Random(0)
    cache_length = 3
    for step in range(200):
        size = rng.randrange(0, 40)
        tree = DraftTree([rng.randrange(100) for _ in range(size)], [rng.randrange(0, i + 1) for i in range(size)])
        with torch.inference_mode() if step % 2 else torch.no_grad():
            mask = build_tree_inputs(1, tree, cache_length, torch.float32, torch.device("cpu")).attention_mask
        visible = ancestor_matrix(np.asarray([-1] + tree.parents))
        expected = torch.zeros(1, 1, size + 1, cache_length + size + 1)
        expected[0, 0, :, cache_length:].masked_fill_(torch.from_numpy(~visible), torch.finfo(torch.float32).min)
        assert torch.equal(mask, expected), step
        cache_length += rng.randrange(0, 40)


def test_kv_cache_commit_works_per_layer_device():
    """A model split over devices keeps each layer's buffers where its keys were computed; a commit sends the
    accepted rows to each device once. Layers on the CPU and on `meta` stand in for two GPUs."""
    cache = PositionalKVCache(num_layers=3, capacity=8)
    keys = torch.arange(24, dtype=torch.float32).reshape(1, 1, 6, 4)
    cache.layers[0].update(keys, keys + 100)
    for layer in cache.layers[1:]:
        layer.update(torch.empty(1, 1, 6, 4, device="meta"), torch.empty(1, 1, 6, 4, device="meta"))
    assert cache.devices == [torch.device("cpu"), torch.device("meta"), torch.device("meta")]
    cache.commit(2, [0, 3])  # keep the prefix of 2, then tree nodes 0 and 3 (rows 2 and 5)
    assert cache.length == 4 and all(layer.length == 4 for layer in cache.layers)
    assert torch.equal(cache.layers[0].keys[0, 0, :4], keys[0, 0, [0, 1, 2, 5]])
    assert torch.equal(cache.layers[0].values[0, 0, :4], keys[0, 0, [0, 1, 2, 5]] + 100)


def test_a_device_map_loads_and_answers_as_the_plain_model(lm, tmp_path):
    """accelerate's `auto` map on a machine without GPUs puts everything on the CPU: the same answers, another run
    identity (a split model times differently), and the placement in the manifest."""
    qfile = write_questions(tmp_path / "q.jsonl", QUESTIONS[1:2])
    [plain] = orchestrate.run(small_config(tmp_path, qfile, "bench.max_new_tokens=2"))
    [mapped] = orchestrate.run(small_config(tmp_path, qfile, "bench.max_new_tokens=2", "model.device_map=auto"))
    assert mapped != plain and answers_of(mapped) == answers_of(plain)
    manifest = json.loads((mapped / "manifest.json").read_text())
    assert manifest["comparison"]["device_map"] == "auto"
    assert manifest["environment"]["device_map"]["devices"] == ["cpu"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: `make gpu-check` would run")
def test_gpu_check_without_cuda_stops_in_one_line():
    done = subprocess.run(["make", "-s", "--no-print-directory", "gpu-check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0 and done.stdout == ""
    ours = [line for line in done.stderr.splitlines() if not line.startswith("make")]  # make adds its own line
    assert len(ours) == 1 and ours[0].startswith("error: make gpu-check needs a CUDA GPU"), done.stderr
