"""Methods plug in by configuration: a method written in a module of its own and described by one YAML file runs
through `run.py` with no other edit, and the report shows it with the metadata its YAML gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from evaluation.catalog import catalog, method_display
from evaluation.engine.errors import HarnessError
from tests.conftest import ROOT, question_file

MODULE = '''
from dataclasses import dataclass

from evaluation.engine.errors import require
from evaluation.engine.method import Method
from evaluation.engine.tree import DraftTree


@dataclass
class RepeatConfig:
    length: int = 3  # tokens drafted: the pending token, repeated

    def check(self) -> None:
        require(1 <= self.length <= 8, "length", self.length, "an integer in [1, 8]")


class RepeatLast(Method):
    """Drafts the pending token again, `length` times: right after a repeated token, wrong elsewhere."""

    Config = RepeatConfig

    @property
    def max_nodes(self) -> int:
        return self.config.length + 1

    def draft(self, state):
        tokens = [state.tokens[-1]] * (self.config.length + 1)
        return DraftTree(tokens=tokens, parents=[-1, *range(self.config.length)])
'''

YAML = '''
_target_: repeat_plugin.RepeatLast
name: repeat-last
display:
  title: Repeat the last token
  family: training-free
  order: 35
  colour: "#123456"
length: 2
'''


def run_cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_method_in_its_own_module_and_yaml_runs_and_shows_in_the_report(tmp_path):
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "repeat_plugin.py").write_text(textwrap.dedent(MODULE))
    (tmp_path / "conf" / "method").mkdir(parents=True)
    (tmp_path / "conf" / "method" / "repeat-last.yaml").write_text(YAML)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "plugins"), str(ROOT)])}
    common = [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"bench.question_file={question_file()}",
              "bench.subtasks=[translation]", "bench.questions_per_subtask=1", "bench.max_new_tokens=12",
              "bench.warmup=0", "run.progress=false", "run.report=false", f"run.results_dir={tmp_path / 'runs'}"]
    for method in ("vanilla", "repeat-last"):
        done = run_cli("run.py", f"method={method}", *common, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
    [manifest] = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/repeat-last-*/manifest.json")]
    assert manifest["method_display"]["title"] == "Repeat the last token"
    assert manifest["options"] == {"length": 2}
    [answers] = (tmp_path / "runs").glob("*/repeat-last-*/answers.jsonl")
    [vanilla] = (tmp_path / "runs").glob("*/vanilla-*/answers.jsonl")
    tokens = [json.loads(line)["choices"][0]["token_ids"] for line in answers.read_text().splitlines()]
    assert tokens == [json.loads(line)["choices"][0]["token_ids"] for line in vanilla.read_text().splitlines()]

    # The report, in a process where conf/method has no such method: the run's manifest says how it shows.
    done = run_cli("-m", "evaluation.report", "--results", str(tmp_path / "runs"), "--out", str(tmp_path / "out"),
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| repeat-last | Repeat the last token | training-free |" in report
    assert "Machine: " in report and "torch threads; torch " in report and "; commit " in report
    speedup_rows = [line.split("|")[1].strip() for line in report.split("**Speedup over vanilla")[1].split("\n\n")[1]
                    .splitlines()[2:]]
    assert speedup_rows == ["vanilla", "repeat-last,length=2"]  # the label names the option its YAML changed


def test_the_catalog_reads_every_method_config_without_importing_it():
    entries = catalog()
    assert {"vanilla", "pld", "logitspec", "gumiho", "eagle2"} <= set(entries)
    assert entries["logitspec"].target == "logitspec.method.LogitSpec"
    assert method_display("pld").published_names == ("PLD",)
    assert method_display("no-such-method").title == "no-such-method"  # a saved run of a method this checkout lacks


def test_a_bad_target_or_display_is_one_line(tmp_path):
    from evaluation.catalog import MethodDisplay, import_class

    with pytest.raises(HarnessError, match="_target_ 'no_such_module.Thing' cannot be imported"):
        import_class("no_such_module.Thing", "thing")
    with pytest.raises(HarnessError, match="names no class"):
        import_class("evaluation.catalog.FAMILIES", "thing")
    with pytest.raises(HarnessError, match="display.family 'trained' is not one of"):
        MethodDisplay.from_config("thing", {"family": "trained"})
    with pytest.raises(HarnessError, match="unknown display key 'color'"):
        MethodDisplay.from_config("thing", {"color": "red"})
    (tmp_path / "a.yaml").write_text("_target_: x.A\nname: same\n")
    (tmp_path / "b.yaml").write_text("_target_: x.B\nname: same\n")
    with pytest.raises(HarnessError, match="method 'same' is defined twice"):
        catalog(tmp_path)


# A trained family of its own: one residual block on the target's last state, read through the target's head,
# predicting the token after next (a one-head Medusa), and the method that drafts with it.
FAMILY_MODULE = '''
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from drafts.checkpoint import read_weights
from drafts.evaluate import target_states
from drafts.family import Family, last_states
from evaluation.engine.method import Method
from evaluation.engine.tree import DraftTree


class AfterNext(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.block = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.block.weight)
        self.config = SimpleNamespace(to_dict=lambda: {"hidden_size": hidden})

    def saved_fields(self):
        return {"family": "toy"}

    def trainable_parameters(self):
        return list(self.parameters())

    def forward(self, h):
        return h + self.block(h)


class AfterNextLoss(nn.Module):
    def __init__(self, draft, head):
        super().__init__()
        self.draft, self.head = draft, (head,)

    def forward(self, h, ids, loss_mask):
        rows = loss_mask[:, 2:].bool()
        logits = self.head[0](self.draft(h[:, :-2][rows])).float()
        loss = F.cross_entropy(logits, ids[:, 2:][rows])
        return loss, {"ce": float(loss.detach())}


class ToyFamily(Family):
    def build(self, lm, options, generator):
        draft = AfterNext(lm.model.config.hidden_size).to(lm.device)
        return draft, AfterNextLoss(draft, lm.model.get_output_embeddings())

    def loss(self, trainer, batch):
        return trainer.model(last_states(trainer.lm, batch), batch["input_ids"], batch["loss_mask"])

    @torch.no_grad()
    def accuracy(self, draft, target, heldout):
        right = total = 0
        for prompt, continuation in heldout:
            ids = torch.tensor([prompt + list(continuation)])
            guess = target.get_output_embeddings()(draft(target_states(target, ids)[0, len(prompt) - 1:-2])).argmax(-1)
            right += int((guess == ids[0, len(prompt) + 1:]).sum())
            total += guess.numel()
        return {"acc1": right / max(total, 1)}


FAMILY = ToyFamily()


@dataclass
class ToyConfig:
    draft: Optional[str] = None

    def check(self):
        pass


class AfterNextDrafter(Method):
    Config = ToyConfig
    needs_hidden_states = True
    hidden_state_layers = (-1,)

    def __init__(self, config, model):
        super().__init__(config, model)
        self.draft_model = AfterNext(model.model.config.hidden_size)
        self.draft_model.load_state_dict({k: v.float() for k, v in read_weights(Path(config.draft)).items()})
        self.draft_model.to(model.device, model.dtype).eval()
        self.head = model.model.get_output_embeddings()

    @property
    def max_nodes(self):
        return 1

    def reset(self, prompt_ids, hidden_states=None):
        self.hidden = hidden_states[-1]

    @torch.inference_mode()
    def draft(self, state):
        return DraftTree.chain([int(self.head(self.draft_model(self.hidden)).argmax())])

    def update(self, state, outcome):
        self.hidden = outcome.hidden_states[outcome.verdict.path[-1]]
'''

FAMILY_YAML = '''
# @package _global_
family:
  name: toy
  plugin: toy_family
  title: After-next head (toy)
  drafts: {drafts}
  work_dir: {work}
  methods: [after-next]
train:
  lr: 3.0e-3
'''

DRAFTER_YAML = '''
_target_: toy_family.AfterNextDrafter
name: after-next
display:
  title: After-next head
  family: trained draft
draft: null
'''


@pytest.mark.slow
def test_a_trained_family_in_its_own_module_and_yaml_trains_loads_and_decodes_losslessly(tmp_path):
    """A family nothing in the repository names: the trainer trains it through its YAML (and its own defaults),
    writes the draft where the YAML says, the report's family registry finds its curve, and a method of its own
    loads the draft and answers exactly as vanilla does."""
    import pandas as pd

    from evaluation.families import families
    from evaluation.report.figures.gumiho import family_curves, plot_family_curves

    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "toy_family.py").write_text(FAMILY_MODULE)
    for group in ("family", "method"):
        (tmp_path / "conf" / group).mkdir(parents=True)
    (tmp_path / "conf" / "family" / "toy.yaml").write_text(
        FAMILY_YAML.format(drafts=tmp_path / "drafts", work=tmp_path / "work"))
    (tmp_path / "conf" / "method" / "after-next.yaml").write_text(DRAFTER_YAML)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "plugins"), str(ROOT)])}
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    done = run_cli("-m", "evaluation.tools.train", "family=toy", search, "train.max_steps=4", "train.max_length=96",
                   "train.dtype=float32", "train.eval_questions=1", "train.eval_new_tokens=8", "train.progress=false",
                   f"train.question_file={question_file()}", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    draft = tmp_path / "drafts" / "smollm2-135m"
    manifest = json.loads((draft / "manifest.json").read_text())
    assert manifest["family"] == "toy" and manifest["steps"] == 4 and manifest["options"]["lr"] == 3.0e-3
    assert (tmp_path / "work" / "smollm2-135m" / "state.pt").is_file()  # resumable where its YAML says

    registry = families(tmp_path / "conf" / "family")
    curves = family_curves("smollm2-135m", registry)
    assert list(curves) == ["toy"] and pd.api.types.is_numeric_dtype(curves["toy"].acc1)
    figure = plot_family_curves(curves, "smollm2-135m", registry=registry)
    assert figure.axes[0].get_legend_handles_labels()[1] == ["After-next head (toy)"]

    common = [search, f"bench.question_file={question_file()}", "bench.subtasks=[translation,qa]",
              "bench.questions_per_subtask=1", "bench.max_new_tokens=24", "bench.warmup=0", "run.progress=false",
              "run.report=false", f"run.results_dir={tmp_path / 'runs'}"]
    done = run_cli("-m", "evaluation.run.interleave", "method=vanilla", f"method=after-next method.draft={draft}",
                   "--", *common, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = {}
    for method in ("vanilla", "after-next"):
        [path] = (tmp_path / "runs").glob(f"*/{method}-*/answers.jsonl")
        answers[method] = [json.loads(line)["choices"][0]["token_ids"] for line in path.read_text().splitlines()]
    assert len(answers["vanilla"]) == 2 and answers["after-next"] == answers["vanilla"]
