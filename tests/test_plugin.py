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
