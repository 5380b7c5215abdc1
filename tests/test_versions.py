"""The environment check: missing packages named with their install command, versions outside the supported range
refused with one line and exit status 2, and `make setup PY=...` using the interpreter as it is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evaluation import versions

ROOT = Path(__file__).resolve().parent.parent
INSTALLED = {"torch": "2.13.0+cpu", "transformers": "5.24.0", "accelerate": "1.16.0"}


def everything_found(name):
    return object()


@pytest.mark.parametrize("version, supported", [
    ("5.17.0", True), ("5.24.0", True), ("5.24.3", True), ("5.16.1", False), ("5.25.0", False), ("4.57.6", False),
    ("5.20.0.dev0", True)])
def test_transformers_range(version, supported):
    assert (versions.SUPPORTED["transformers"].problem(version) is None) == supported


def test_the_installed_versions_are_supported():
    findings = versions.check()
    assert not findings.missing and not findings.unsupported, findings


def test_a_version_outside_the_range_gives_one_line_and_exit_2(monkeypatch, capsys):
    installed = {**INSTALLED, "transformers": "5.16.1"}
    findings = versions.check(version_of=installed.get, find_module=everything_found)
    assert findings.unsupported == [line for line in findings.unsupported if line.startswith("transformers 5.16.1")]
    assert len(findings.unsupported) == 1 and "Cache" in findings.unsupported[0]  # says what breaks
    monkeypatch.delenv(versions.ALLOW_UNSUPPORTED, raising=False)
    with pytest.raises(SystemExit) as exit_:
        versions.require_supported_environment(findings)
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("error: transformers 5.16.1 is not supported (supported: 5.17 <= version < 5.25)")
    assert "SPECDEC_ALLOW_UNSUPPORTED=1" in lines[-1] and len(lines) == 2


def test_torch_outside_the_range_and_the_override(monkeypatch, capsys):
    installed = {**INSTALLED, "torch": "2.10.0+cu128"}
    findings = versions.check(version_of=installed.get, find_module=everything_found)
    assert [line.split(" is not")[0] for line in findings.unsupported] == ["torch 2.10.0+cu128"]
    monkeypatch.setenv(versions.ALLOW_UNSUPPORTED, "1")
    versions.require_supported_environment(findings)  # runs anyway, with a warning
    assert capsys.readouterr().err.startswith("warning: torch 2.10.0+cu128 is not supported")


def test_missing_packages_are_named_with_the_command_that_installs_them(capsys):
    absent = {"hydra", "fastchat", "matplotlib"}
    findings = versions.check(version_of=INSTALLED.get,
                              find_module=lambda module: None if module in absent else object())
    assert [line.split(" ")[0] for line in findings.missing] == ["hydra-core", "fschat"]
    assert findings.missing[0].endswith("-m pip install hydra-core==1.3.8")  # the pin of requirements.txt
    assert findings.missing[1].endswith("-m pip install --no-deps fschat==0.2.36")
    assert [line.split(" ")[0] for line in findings.optional] == ["matplotlib"]
    with pytest.raises(SystemExit) as exit_:
        versions.require_supported_environment(findings)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "install.sh" in err.splitlines()[-1]  # the offline route


def test_make_setup_with_an_interpreter_of_ones_own_creates_nothing(tmp_path):
    """`make setup PY=...` checks that interpreter instead of building .venv (dry run: what make would run)."""
    plan = subprocess.run(["make", "-n", "--no-print-directory", "setup", f"PY={sys.executable}"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    assert plan.strip() == f"{sys.executable} -m evaluation.versions"
    done = subprocess.run(["make", "--no-print-directory", "setup", f"PY={sys.executable}"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == f"ready: {sys.executable}"
