"""Draft folders and training files that cannot be silently wrong: a name that would become a path outside the
project is refused, a folder the harness did not write is never replaced, a draft is replaced only whole, a broken
draft folder ends in one line, the training state holds no pickled objects, and `make clean` keeps what resumes."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from drafts.checkpoint import load_draft, save_draft
from drafts.serial_draft import SerialDraft
from evaluation.engine.errors import HarnessError, OptionError
from evaluation.families import family as registered
from tests.conftest import question_file
from tests.test_train import options, trainer_of

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "gumiho" / "drafts" / "smollm2-135m"


def victim(tmp_path: Path) -> Path:
    """A folder the harness did not write, with a file in it."""
    folder = tmp_path / "victim"
    folder.mkdir(parents=True)
    (folder / "thesis.tex").write_text("years of work")
    return folder


def tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------ names that become paths

@pytest.mark.parametrize("name", ["../../../victim", "..", ".", "a/b", "{tmp}/victim", "", "victim/"])
def test_training_refuses_a_model_name_that_is_not_a_plain_name(lm, tmp_path, monkeypatch, name):
    """The default work and out folders are <repository>/results/train/<name> and <repository>/gumiho/drafts/<name>:
    with the repository moved into tmp_path, `../../../victim` would be tmp_path/victim."""
    repo = tmp_path / "repo"
    repo.mkdir()
    moved = dataclasses.replace(registered("gumiho"), drafts=repo / "gumiho" / "drafts",
                                work_dir=repo / "results" / "train")
    target = victim(tmp_path)
    before = tree(tmp_path)
    name = name.replace("{tmp}", str(tmp_path))
    with pytest.raises(OptionError, match=r"^bad value for model\.name: .*letters, digits"):
        trainer_of(lm, options(tmp_path, max_steps=1, work_dir=None, out_dir=None), moved, name).run()
    assert tree(tmp_path) == before and target.is_dir()
    assert not any(repo.iterdir())


@pytest.fixture(scope="module")
def refused_training(tmp_path_factory):
    """The real command with `model.name=../../victim`, run once for the two tests below (it loads the model)."""
    tmp_path = tmp_path_factory.mktemp("cli")
    target = victim(tmp_path)
    before = tree(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "evaluation.tools.train", "model.name=../../victim", "train.max_steps=1",
         "train.progress=false", f"train.work_dir={tmp_path / 'work'}", f"train.out_dir={tmp_path / 'out'}",
         f"train.question_file={question_file()}"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    return done, tmp_path, target, before


def test_training_command_refuses_a_path_as_model_name(refused_training):
    """Through the real command: refused, no traceback, nothing written (Hydra's own log, train.log, goes
    to the working directory, tmp_path here)."""
    done, tmp_path, target, before = refused_training
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0, done.stderr
    assert lines[-1].startswith("error: bad value for model.name: '../../victim' (allowed: a name of"), done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert {k: v for k, v in tree(tmp_path).items() if not k.endswith(".log")} == before and target.is_dir()


def test_training_command_reports_a_bad_model_name_as_a_run_does(refused_training):
    """One line, exit status 2, before the model loads: what `run.py` gives for the same value."""
    done = refused_training[0]
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


# ------------------------------------------------------------------------------------ replacing a draft folder

def tiny_draft(lm) -> SerialDraft:
    torch.manual_seed(0)
    return SerialDraft.for_target(lm.model, 1)


def test_a_folder_the_harness_did_not_write_is_never_replaced(lm, tmp_path):
    target = victim(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    before = tree(tmp_path)
    for folder in (target, empty, a_file):
        with pytest.raises(HarnessError, match=f"{re.escape(str(folder))} exists and is not a draft written by") \
                as caught:
            save_draft(tiny_draft(lm), folder, {"target": "tiny"})
        assert "\n" not in str(caught.value)
    assert tree(tmp_path) == before and empty.is_dir() and not any(empty.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "empty", "victim"]  # no temporary folder left


def test_training_refuses_a_foreign_out_dir_before_it_trains(lm, tmp_path):
    target = victim(tmp_path)
    before = tree(tmp_path)
    with pytest.raises(HarnessError, match=f"{re.escape(str(target))}.*not a draft written by the harness"):
        trainer_of(lm, options(tmp_path, max_steps=1, out_dir=str(target))).run()
    assert tree(tmp_path) == before and not (tmp_path / "work").exists()


def test_a_draft_is_replaced_whole_or_not_at_all(lm, tmp_path, monkeypatch):
    folder = tmp_path / "drafts" / "tiny"
    save_draft(tiny_draft(lm), folder, {"target": "tiny", "round": 1}, files={"curve.csv": "tokens\n1\n"})
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "curve.csv", "manifest.json",
                                                         "model.safetensors"]
    first = tree(folder)

    import safetensors.torch

    def dies_halfway(tensors, path, metadata=None):
        Path(path).write_bytes(b"half a file")
        raise KeyboardInterrupt  # a kill while the weights are written

    monkeypatch.setattr(safetensors.torch, "save_file", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        save_draft(tiny_draft(lm), folder, {"target": "tiny", "round": 2})
    monkeypatch.undo()
    assert tree(folder) == first
    assert [p.name for p in folder.parent.iterdir()] == ["tiny"]  # no temporary folder left beside it

    save_draft(SerialDraft.for_target(lm.model, 2), folder, {"target": "tiny", "round": 3})
    assert json.loads((folder / "manifest.json").read_text())["round"] == 3
    assert not (folder / "curve.csv").exists()  # the old folder went whole, not file by file
    assert [p.name for p in folder.parent.iterdir()] == ["tiny"]
    assert load_draft(folder, lm.model).mlp_num == 2


# ------------------------------------------------------------------------------------ broken draft folders

def broken_config(folder):
    (folder / "config.json").write_text('{"hidden_size": 576,')


def config_not_an_object(folder):
    (folder / "config.json").write_text("[1, 2]")


def random_safetensors(folder):
    (folder / "model.safetensors").write_bytes(os.urandom(4096))


def random_bin(folder):
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(os.urandom(4096))


def bin_of_strings(folder):
    (folder / "model.safetensors").unlink()
    torch.save({"fc.weight": "not a tensor", "layers.0.x": 3}, folder / "pytorch_model.bin")


def bin_of_a_list(folder):
    (folder / "model.safetensors").unlink()
    torch.save([torch.zeros(2)], folder / "pytorch_model.bin")


class Planted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def bin_with_code(folder):
    (folder / "model.safetensors").unlink()
    torch.save({"fc.weight": Planted(str(folder.parent / "ran")), "x": torch.zeros(1)}, folder / "pytorch_model.bin")


@pytest.mark.parametrize("breaks, file, problem", [
    (broken_config, "config.json", "not valid JSON"),
    (config_not_an_object, "config.json", "not a JSON object"),
    (random_safetensors, "model.safetensors", "cannot be read as safetensors"),
    (random_bin, "pytorch_model.bin", "cannot be read as a PyTorch state dict"),
    (bin_of_strings, "pytorch_model.bin", "not a tensor"),
    (bin_of_a_list, "pytorch_model.bin", "not a dict of tensors"),
    (bin_with_code, "pytorch_model.bin", "cannot be read as a PyTorch state dict"),
])
def test_a_broken_draft_folder_is_one_line_naming_the_file(lm, tmp_path, breaks, file, problem):
    folder = tmp_path / "draft"
    shutil.copytree(COMMITTED, folder)
    breaks(folder)
    with pytest.raises(HarnessError) as caught:
        load_draft(folder, lm.model)
    message = str(caught.value)
    assert "\n" not in message and str(folder / file) in message and problem in message, message
    assert not (tmp_path / "ran").exists()  # nothing in the file was run


def test_a_run_with_a_broken_draft_ends_in_one_line(tmp_path):
    folder = tmp_path / "draft"
    shutil.copytree(COMMITTED, folder)
    random_safetensors(folder)
    done = subprocess.run(
        [sys.executable, "run.py", "method=gumiho", f"method.draft={folder}", f"run.results_dir={tmp_path / 'runs'}",
         f"bench.question_file={question_file()}", "bench.questions_per_subtask=1", "bench.max_new_tokens=2",
         "bench.warmup=0", "run.progress=false", "run.report=false", "model.dtype=float32", "run.device=cpu"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    # The error is one line, the last; before it only transformers' own bar for the target's weights (the draft
    # is read once the target is loaded).
    assert lines[-1].startswith("error: draft weights ") and str(folder / "model.safetensors") in lines[-1]
    assert all(line.startswith("Loading weights") for line in lines[:-1]), done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------ the training state

def test_the_training_state_is_plain_tensors_and_numbers(lm, tmp_path):
    trainer = trainer_of(lm, options(tmp_path, max_steps=1))
    trainer.run()
    path = tmp_path / "work" / "state.pt"
    state = torch.load(path, map_location="cpu", weights_only=True)  # raises on anything but tensors and numbers
    assert state["step"] == 1 and isinstance(state["rng"]["numpy"], dict)

    # The RNG states come back as they were saved.
    random.seed(1), np.random.seed(1)
    trainer.save_state()
    saved_python, saved_numpy = random.getstate(), np.random.get_state()
    random.random(), np.random.random()
    assert trainer_of(lm, options(tmp_path, max_steps=1)).load_state()
    assert random.getstate() == saved_python
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), saved_numpy))


def test_a_training_state_with_code_in_it_is_refused_unrun(lm, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "ran"
    torch.save({"step": 1, "payload": Planted(str(marker))}, work / "state.pt")
    with pytest.raises(HarnessError, match=f"^training state {re.escape(str(work / 'state.pt'))} cannot be read") \
            as caught:
        trainer_of(lm, options(tmp_path, max_steps=1)).load_state()
    assert "\n" not in str(caught.value)
    assert not marker.exists()


def test_a_training_state_of_other_options_is_one_line(lm, tmp_path):
    """A state of a draft with two heads, resumed with one: named, not a traceback."""
    trainer_of(lm, options(tmp_path, max_steps=1, mlp_num=2)).save_state()
    with pytest.raises(HarnessError, match=f"^training state {re.escape(str(tmp_path / 'work' / 'state.pt'))} does "
                                           f"not fit this training \\(RuntimeError: ") as caught:
        trainer_of(lm, options(tmp_path, max_steps=1, mlp_num=1)).load_state()
    assert "\n" not in str(caught.value)


def test_the_default_work_dir_is_kept_out_of_scratch_and_git(lm):
    trainer = trainer_of(lm, options(Path("/nonexistent"), work_dir=None, out_dir=None))
    assert trainer.work_dir == ROOT / "results" / "train" / "tiny"
    assert trainer.out_dir == ROOT / "gumiho" / "drafts" / "tiny"
    ignored = subprocess.run(["git", "check-ignore", "-q", "results/train/tiny/state.pt"], cwd=ROOT)
    assert ignored.returncode == 0


# ------------------------------------------------------------------------------------ make clean

def test_make_clean_keeps_what_resumes_and_says_what_it_removed(tmp_path):
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    files = {
        "results/scratch/hydra/2026-01-01/run.log": False,  # False: removed
        "results/scratch/upstream/Spec-Bench/README.md": False,
        "results/scratch/notes.txt": False,
        ".pytest_cache/v/cache": False,
        "results/scratch/train/smollm2-135m/state.pt": True,  # a training state from before results/train/
        "results/scratch/mine/state.pt": True,  # train.work_dir=results/scratch/mine
        "results/scratch/budget_off_runs/m/vanilla-0123456789/answers.jsonl": True,  # saved runs that resume
        "results/train/smollm2-135m/state.pt": True,
        "results/runs/m/x/answers.jsonl": True,
    }
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    done = subprocess.run(["make", "--no-print-directory", "clean"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    for name, kept in files.items():
        assert (tmp_path / name).exists() == kept, name
    said = done.stdout.splitlines()
    for removed in ("results/scratch/hydra", "results/scratch/upstream", "results/scratch/notes.txt", ".pytest_cache"):
        assert f"removed {removed}" in said, done.stdout
    assert not any(line.startswith("removed") and ("train" in line or "runs" in line) for line in said)
