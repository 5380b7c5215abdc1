"""Released checkpoints paired with each target: the one table (`conf/checkpoints.yaml`) that says which trained
part a method loads for a target when its option names none.

A trained method names its trained part with one option (`checkpoint_option`: `draft` for EAGLE and Gumiho, `heads`
for Medusa and Hydra, `draft_model` for SpS) and says which kind of checkpoint it reads (`checkpoint_kind`). Left at
null, the option means: the draft committed for the target in this repository when there is one, else the
released checkpoint this table pairs with the target, else the method is unavailable for that target and says why
in one line (`make bench` leaves it out with that line). Reading the table imports no torch and no method.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

from evaluation.engine.errors import HarnessError
from evaluation.families import family

TABLE = Path(__file__).resolve().parent.parent / "conf" / "checkpoints.yaml"


@dataclass(frozen=True)
class Released:
    """One released checkpoint: the target it was trained for, its kind, its hub id and where that id is published."""

    target: str  # a target's name as conf/model names it (vicuna-7b-v1.3)
    kind: str  # eagle, eagle3, medusa, hydra, gumiho, draft-model
    hub_id: str
    source: str  # the README or model card that names it, with its commit where there is one
    note: str = ""


@dataclass(frozen=True)
class Kind:
    """A kind of trained part: what it is, the methods that read it and the option that names it."""

    name: str
    title: str
    methods: tuple[str, ...]
    option: str


@functools.lru_cache(maxsize=2)
def _read(path: Path) -> tuple[dict[str, Kind], dict[tuple[str, str], Released], dict[str, str]]:
    try:
        node = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise HarnessError(f"{path}: not a readable YAML file ({' '.join(str(exc).split())[:200]})") from None
    sources = {str(k): str(v) for k, v in (node.get("sources") or {}).items()}
    kinds = {str(name): Kind(str(name), str(k["title"]), tuple(k["methods"]), str(k["option"]))
             for name, k in (node.get("kinds") or {}).items()}
    table: dict[tuple[str, str], Released] = {}
    for target, entries in (node.get("targets") or {}).items():
        for kind, entry in (entries or {}).items():
            if kind not in kinds:
                raise HarnessError(f"{path}: target {target!r} names an unknown kind {kind!r} "
                                   f"(kinds: {', '.join(kinds)})")
            source = str(entry["source"])
            if source not in sources:
                raise HarnessError(f"{path}: target {target!r}, {kind}: unknown source {source!r}")
            table[str(target), kind] = Released(str(target), kind, str(entry["id"]), sources[source],
                                                str(entry.get("note") or ""))
    return kinds, table, sources


def kinds(path: Path = TABLE) -> dict[str, Kind]:
    return _read(Path(path))[0]


def pairing_table(path: Path = TABLE) -> list[Released]:
    """Every pairing, in the table's order (target by target)."""
    return list(_read(Path(path))[1].values())


def targets(path: Path = TABLE) -> list[str]:
    """The targets the table pairs checkpoints with, in its order."""
    return list(dict.fromkeys(entry.target for entry in pairing_table(path)))


def released(target: str, kind: str, path: Path = TABLE) -> Released | None:
    """The released checkpoint of `kind` paired with the target `target` (a conf/model name), or None."""
    return _read(Path(path))[1].get((target, kind))


def has_weights(folder: Path) -> bool:
    """A folder that holds a checkpoint: its config.json is there."""
    return (folder / "config.json").is_file()


def default_source(kind: str, target: str, committed: Path | None) -> str | None:
    """What a trained method loads with its option at null: the committed folder (when it holds a checkpoint), else
    the released checkpoint paired with the target, else None."""
    if committed is not None and has_weights(committed):
        return str(committed)
    paired = released(target, kind)
    return paired.hub_id if paired is not None else None


def unavailable(kind: str, target: str, committed: Path | None, train_command: str | None) -> str:
    """Why a method of `kind` has nothing to load for `target` with its option at null, as one clause."""
    entry = kinds().get(kind)
    title = entry.title if entry else kind
    option = entry.option if entry else "draft"
    where = "committed or released" if committed else "released"
    train = f"train one: {train_command} MODEL={target}; or " if train_command else ""
    return f"no {title} {where} for {target} ({train}method.{option}=<hub id or folder>)"


class PairedCheckpoint:
    """What a method whose trained part is named by one option shares (mixed into its `Method` class): with the
    option at null, the part committed under `committed_dir(model)`, else the release paired with the target. A
    class sets `checkpoint_kind`, `checkpoint_option`, and `trained_family` when the harness trains and commits
    parts for it (conf/family/<name>.yaml says where they live and how to train one)."""

    checkpoint_kind: str
    checkpoint_option: str
    trained_family: str | None = None  # the family whose committed parts it runs (evaluation/families.py)
    fallback: str = ""  # what else the user may run, for the error when there is nothing to load
    NOT_LOADED = ("random", "self")  # option values that load no checkpoint (a seeded random part, the target)

    @classmethod
    def committed_dir(cls, model_name: str) -> Path | None:
        return family(cls.trained_family).committed_dir(model_name) if cls.trained_family else None

    @classmethod
    def train_command(cls) -> str | None:
        return family(cls.trained_family).train_command if cls.trained_family else None

    @classmethod
    def trained_source(cls, config, model_name: str) -> str | None:
        """The option as named; null: the committed part, else the release paired with the target."""
        named = getattr(config, cls.checkpoint_option)
        if named in cls.NOT_LOADED:
            return None
        if named is not None:
            return named
        return default_source(cls.checkpoint_kind, model_name, cls.committed_dir(model_name))

    @classmethod
    def missing_checkpoint(cls, model_name: str) -> str:
        """Why there is nothing to load for the target with the option at null, as one clause."""
        return unavailable(cls.checkpoint_kind, model_name, cls.committed_dir(model_name), cls.train_command())

    @classmethod
    def unavailable_reason(cls, model_name: str) -> str | None:
        if default_source(cls.checkpoint_kind, model_name, cls.committed_dir(model_name)) is not None:
            return None
        return cls.missing_checkpoint(model_name)

    def checkpoint_source(self, config, model_name: str) -> str:
        """The folder or hub id to load (`trained_source`); one line when there is none."""
        source = self.trained_source(config, model_name)
        if source is None:
            raise HarnessError(f"{self.missing_checkpoint(model_name)}{self.fallback}")
        return source

def _shown(folder: Path) -> str:
    """A folder relative to the repository when it is inside it."""
    try:
        return str(folder.resolve().relative_to(TABLE.parent.parent))
    except ValueError:
        return str(folder)


def markdown(path: Path = TABLE) -> str:
    """The pairing table as docs/checkpoints.md shows it: a row per target, a column per kind, then the sources."""
    kind_list = kinds(path)
    lines = ["| target | " + " | ".join(f"{k.title} (`{'`, `'.join(k.methods)}`)" for k in kind_list.values()) + " |",
             "|:--|" + ":--|" * len(kind_list)]
    for target in targets(path):
        cells = []
        for kind in kind_list:
            entry = released(target, kind, path)
            cells.append("–" if entry is None else f"`{entry.hub_id}`" + (f" ({entry.note})" if entry.note else ""))
        lines.append(f"| `{target}` | " + " | ".join(cells) + " |")
    lines += ["", "Sources (at the commit read):", ""]
    lines += [f"- {name}: {url}" for name, url in _read(Path(path))[2].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # `python -m evaluation.checkpoints`: the table docs/checkpoints.md shows
    print(markdown(), end="")
