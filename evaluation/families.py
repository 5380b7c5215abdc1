"""The trained-draft families, found through their configs: each `conf/family/<name>.yaml` names the module that
plugs the family into the shared trainer (`plugin`, a module holding `FAMILY`, see drafts/family.py), where its
committed drafts live, how it shows in figures, which method configs run its drafts, and its training defaults
(the `train` block, laid over the recipe). A new family is that module and that YAML; the trainer, `make train`,
`make bench-families` and the report's family figures read the list from here.

Reading the registry imports no family and no torch (the report runs where neither is installed).

    python -m evaluation.families names|methods     (for the Makefile: the families, or their bench methods)
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from evaluation.engine.errors import HarnessError

ROOT = Path(__file__).resolve().parent.parent
FAMILY_CONF = ROOT / "conf" / "family"
KEYS = ("name", "plugin", "title", "drafts", "work_dir", "methods")


@dataclass(frozen=True)
class FamilyEntry:
    """One trained-draft family: its name, the module that plugs it in, and where its drafts and states go."""

    name: str
    plugin: str  # the module holding `FAMILY` (a drafts.family.Family)
    title: str  # how figures name it
    drafts: Path  # committed drafts: <drafts>/<model>/
    work_dir: Path  # resumable training states: <work_dir>/<model>/
    methods: tuple[str, ...] = ()  # the method configs that run its drafts (make bench-families)

    @classmethod
    def from_config(cls, config: dict, source: str = "") -> "FamilyEntry":
        """From the `family` block of a family config; relative folders are relative to the repository."""
        block = config.get("family") if isinstance(config, dict) else None
        if not isinstance(block, dict):
            raise HarnessError(f"family config {source}: no `family:` block")
        unknown = sorted(set(block) - set(KEYS))
        missing = [key for key in ("name", "plugin", "drafts") if not block.get(key)]
        if unknown or missing:
            what = f"unknown key {unknown[0]!r}" if unknown else f"no {missing[0]!r}"
            raise HarnessError(f"family config {source}: {what} (keys: {', '.join(KEYS)})")
        name = str(block["name"])
        return cls(name=name, plugin=str(block["plugin"]), title=str(block.get("title") or name),
                   drafts=_folder(block["drafts"]), work_dir=_folder(block.get("work_dir") or f"results/train/{name}"),
                   methods=tuple(str(m) for m in block.get("methods") or ()))

    def committed_dir(self, model_name: str) -> Path:
        return self.drafts / model_name

    @property
    def train_command(self) -> str:
        return f"make train FAMILY={self.name}"


def _folder(value) -> Path:
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else ROOT / path


@functools.lru_cache(maxsize=None)
def _families(folder: Path) -> dict[str, FamilyEntry]:
    found = {}
    for path in sorted(folder.glob("*.yaml")):
        try:
            config = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise HarnessError(f"family config {path} cannot be read ({str(exc).splitlines()[0]})") from None
        entry = FamilyEntry.from_config(config, str(path))
        if entry.name != path.stem:
            raise HarnessError(f"family config {path}: its name is {entry.name!r}, its file {path.stem!r}")
        found[entry.name] = entry
    return found


def families(folder: Path | None = None) -> dict[str, FamilyEntry]:
    """Every family, by name, in file-name order."""
    return dict(_families(Path(folder or FAMILY_CONF)))


def family(name: str, folder: Path | None = None) -> FamilyEntry:
    known = families(folder)
    if name not in known:
        raise HarnessError(f"unknown trained-draft family {name!r} (families: {', '.join(known)})")
    return known[name]


def main(argv: list[str]) -> None:
    if argv == ["names"]:
        print(" ".join(families()))
    elif argv == ["methods"]:
        print(" ".join(dict.fromkeys(m for entry in families().values() for m in entry.methods)))
    else:
        sys.exit("usage: python -m evaluation.families names|methods")


if __name__ == "__main__":
    main(sys.argv[1:])
