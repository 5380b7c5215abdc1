"""The offline bundle's install side: what install.sh runs on the node, with the node's own interpreter.

`make offline-bundle` (evaluation/tools/offline_bundle.py, the build side) copies this file into the bundle, and
the bundle's install.sh (evaluation/tools/offline_install.sh) runs that copy before anything else is installed:

    python offline_install.py verify|install-wheels|install-wheel|join|convert|place-rest|get BUNDLE ...

So it imports only the standard library at the top (the harness's own modules only inside `convert` and
`place_rest`, which install.sh runs with the repository on PYTHONPATH, once the wheels are in). The pieces both
sides share are here, and the build side imports them from here: a bundle's manifest (MANIFEST.json: every file
with its size and sha256, a file larger than a part as its parts in order), checking and joining the pieces,
the packages an install never changes, pip. Errors are one line, `error: ...`, exit status 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Never changed by an install from the bundle: the node's own stack.
PROTECTED = {"torch", "torchvision", "torchaudio", "triton", "transformers", "accelerate", "numpy", "tokenizers",
             "safetensors", "huggingface-hub"}


class BundleError(Exception):
    """A failure reported as one line, `error: <message>`, exit status 2."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def say(message: str) -> None:
    print(message, flush=True)


def human(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


# ----------------------------------------------------------------------------------------------- parts
def _file_sha256(path: Path) -> str:
    """evaluation.files.file_sha256, which the build side writes the manifest with. Repeated here because this file
    runs from the bundle, where the repository's packages are not importable."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_piece(path: Path, size: int, sha256: str, what: str) -> None:
    if not path.is_file():
        raise BundleError(f"{what} is missing: copy the whole bundle again")
    if path.stat().st_size != size:
        raise BundleError(f"{what} has {path.stat().st_size} bytes, expected {size}: it is incomplete or corrupt; "
                          "copy it again")
    got = _file_sha256(path)
    if got != sha256:
        raise BundleError(f"{what}: sha256 mismatch (expected {sha256[:16]}..., got {got[:16]}...): it is corrupt; "
                          "copy it again")


def join_file(root: Path, entry: dict, out: Path) -> Path:
    """Rebuild the file of a manifest entry (whole or split) at `out`, checking every part's and the whole sha256.

    Written to a temporary name beside `out` and renamed, so a failure leaves nothing at `out`.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    try:
        if not entry.get("parts"):
            _check_piece(root / entry["path"], entry["size"], entry["sha256"], entry["path"])
            shutil.copyfile(root / entry["path"], tmp)
        else:
            whole = hashlib.sha256()
            with open(tmp, "wb") as f:
                for part in entry["parts"]:
                    _check_piece(root / part["path"], part["size"], part["sha256"], part["path"])
                    with open(root / part["path"], "rb") as piece:
                        for block in iter(lambda: piece.read(1 << 20), b""):
                            f.write(block)
                            whole.update(block)
            if whole.hexdigest() != entry["sha256"]:
                raise BundleError(f"{entry['path']}: the joined parts' sha256 is {whole.hexdigest()[:16]}..., "
                                  f"expected {entry['sha256'][:16]}...: parts missing or out of order")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def verify_bundle(bundle: Path) -> tuple[int, int]:
    """Check every file and part the manifest lists (size and sha256); return (files, bytes)."""
    manifest = read_manifest(bundle)
    count = total = 0
    for entry in manifest["files"]:
        for piece in entry.get("parts") or [entry]:
            _check_piece(bundle / piece["path"], piece["size"], piece["sha256"], piece["path"])
            count += 1
            total += piece["size"]
    return count, total


def read_manifest(bundle: Path) -> dict:
    path = bundle / "MANIFEST.json"
    if not path.is_file():
        raise BundleError(f"{path} is missing: not an offline bundle, or an incomplete copy")
    return json.loads(path.read_text())


def entry_for(manifest: dict, path: str) -> dict:
    for entry in manifest["files"]:
        if entry["path"] == path:
            return entry
    raise BundleError(f"MANIFEST.json lists no {path}")


# ----------------------------------------------------------------------------------------------- pins, pip
def read_pins(*files: Path) -> dict[str, str]:
    """name -> version of every `name==version` line."""
    pins = {}
    for path in files:
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if "==" in line:
                name, version = line.split("==", 1)
                pins[normalize(name)] = version.strip()
    return pins


def run_pip(args: list[str], what: str, cwd: Path | None = None) -> str:
    process = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True)
    if process.returncode != 0:
        lines = [line for line in (process.stderr + process.stdout).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR:")]
        last = (errors or lines or ["(no output)"])[0 if errors else -1].removeprefix("ERROR: ").strip()
        raise BundleError(f"{what}: pip says: {last}")
    return process.stdout


def importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ----------------------------------------------------------------------------------------------- node side
def installed_versions() -> dict[str, str]:
    from importlib import metadata

    versions = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and normalize(name) not in versions:  # the first on sys.path wins, as for imports
            versions[normalize(name)] = dist.version
    return versions


def pip_args() -> list[str]:
    return shlex.split(os.environ.get("PIP_ARGS", ""))


def pip_install(args: list[str], what: str) -> None:
    run_pip(["install", "--no-index", "--disable-pip-version-check", *args, *pip_args()], what)


def pip_version() -> tuple[int, ...]:
    out = run_pip(["--version"], "pip")
    return tuple(int(x) for x in re.findall(r"\d+", out.split()[1])[:2])


def wheels_folder(bundle: Path, manifest: dict, scratch: Path) -> Path:
    """wheels/ as pip's --find-links reads it: the bundle's own folder, or a copy with split wheels joined."""
    entries = [e for e in manifest["files"] if e["path"].startswith("wheels/")]
    if not any(e.get("parts") for e in entries):
        return bundle / "wheels"
    folder = scratch / "wheels"
    for entry in entries:
        join_file(bundle, entry, folder / Path(entry["path"]).name)
    return folder


def install_wheels(bundle: Path) -> None:
    """Install wheels/requirements.txt (resolved against the interpreter's own packages) and
    wheels/requirements-nodeps.txt, refusing any plan that would change a protected package."""
    from urllib.parse import unquote, urlparse

    manifest = read_manifest(bundle)
    pins = read_pins(bundle / "wheels" / "requirements.txt")
    nodeps = read_pins(bundle / "wheels" / "requirements-nodeps.txt")
    before = installed_versions()
    wanted = {**pins, **nodeps}
    if all(before.get(name) == version for name, version in wanted.items()):
        say(f"wheels: already installed ({', '.join(f'{n}=={v}' for n, v in wanted.items())})")
        return
    if pip_version() < (22, 2):
        raise BundleError(f"pip {'.'.join(map(str, pip_version()))} is too old to plan the install (22.2 or later "
                          "has --dry-run --report): upgrade pip, or install by hand as README.md says")
    with tempfile.TemporaryDirectory() as tmp:
        wheels = wheels_folder(bundle, manifest, Path(tmp))
        # pip's own resolver, as a dry run against what this interpreter has, says exactly which wheels to add;
        # they are then installed with --no-deps, so --target or --prefix (which make pip ignore what is
        # installed) cannot bring in a second numpy.
        report = Path(tmp) / "report.json"
        run_pip(["install", "--dry-run", "--no-index", "--find-links", str(wheels), "--quiet", "--report",
                 str(report), "-r", str(bundle / "wheels" / "requirements.txt")], "planning the install")
        plan = json.loads(report.read_text()).get("install", [])
        to_install, replaced = [], []
        for item in plan:
            name, version = normalize(item["metadata"]["name"]), item["metadata"]["version"]
            if name in before and before[name] != version:
                if name in PROTECTED or name.startswith("nvidia-"):
                    raise BundleError(f"installing the bundle would replace {name} {before[name]} by {version}; it "
                                      "never changes the node's own torch, transformers, accelerate or numpy")
                replaced.append(f"{name} {before[name]} -> {version}")
            to_install.append(unquote(urlparse(item["download_info"]["url"]).path))
        if to_install:
            pip_install(["--no-deps", *to_install], "installing the wheels")
        missing_nodeps = [f"{n}=={v}" for n, v in nodeps.items() if before.get(n) != v]
        if missing_nodeps:
            pip_install(["--find-links", str(wheels), "--no-deps", *missing_nodeps], "installing the --no-deps wheels")
    after = installed_versions()
    changed = [f"{n} {before[n]} -> {after.get(n)}" for n in sorted(before)
               if (n in PROTECTED or n.startswith("nvidia-")) and after.get(n) != before[n]]
    if changed:
        raise BundleError(f"the install changed the node's own packages: {', '.join(changed)}")
    wrong = [f"{n}=={v} (found {after.get(n)})" for n, v in wanted.items() if after.get(n) != v]
    if wrong:
        hint = " (with --target, put its folder on PYTHONPATH)" if "--target" in " ".join(pip_args()) else ""
        raise BundleError(f"after the install these are not seen at their pinned versions: {', '.join(wrong)}{hint}")
    added = [f"{normalize(i['metadata']['name'])}=={i['metadata']['version']}" for i in plan] + missing_nodeps
    kept = [f"{n} {before[n]}" for n in ("torch", "transformers", "accelerate", "numpy") if n in before]
    say(f"wheels: installed {len(added)}: {', '.join(added)}"
        + (f"; replaced {', '.join(replaced)}" if replaced else "")
        + (f"; unchanged: {', '.join(kept)}" if kept else ""))


def install_single(bundle: Path, path: str, label: str, check_file: str | None = None) -> None:
    """Install one wheel of the manifest (whole or in parts) with --no-deps, unless already there."""
    import importlib.util

    entry = entry_for(read_manifest(bundle), path)
    with tempfile.TemporaryDirectory() as tmp:
        # The wheel's own name and version, from the joined file when needed.
        name = normalize(Path(path).name.split("-")[0])
        version = Path(path).name.split("-")[1]
        if installed_versions().get(name) == version:
            spec = importlib.util.find_spec(name.replace("-", "_"))
            where = Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None
            if check_file is None or (where is not None and (where / check_file).is_file()):
                say(f"{label}: {name}=={version} already installed{f' ({where})' if where else ''}")
                return
        wheel = join_file(bundle, entry, Path(tmp) / Path(path).name)
        pip_install(["--no-deps", "--force-reinstall", str(wheel)], f"installing {wheel.name}")
    parts = len(entry.get("parts") or [1])
    say(f"{label}: joined {parts} part(s), sha256 {entry['sha256'][:16]}... checked, installed {name}=={version}")


def convert() -> None:
    from evaluation.models import convert_embedded, default_cache_dir

    target = default_cache_dir() / "smollm2-135m-instruct"
    if (target / "conversion.json").is_file():
        say(f"convert: the embedded model is already converted at {target}")
        return
    started = time.perf_counter()
    folder = convert_embedded(default_cache_dir())
    check = json.loads((folder / "conversion.json").read_text())["greedy_check"]
    say(f"convert: embedded model converted into {folder} in {time.perf_counter() - started:.0f} s "
        f"(greedy check on {len(check['gguf_ids'])} tokens: equal)")


def place_rest(bundle: Path) -> None:
    """Put the prebuilt datastore exactly where `method=rest method.max_conversations=N` looks for it.

    REST finds a cached datastore by the sha256 of the tokenizer's serialization, which differs between transformers
    versions even where the encoding is the same (transformers 5.17 and 5.24 serialize SmolLM2's converted tokenizer
    differently). Then the corpus slice is tokenized again here with the node's tokenizer (as rest_datastore does,
    seconds for 2,000 conversations): equal ids and entry starts give the same datastore (the suffix array depends
    on the ids alone), which is placed under the node's key with the node's tokenizer hash in its manifest.
    """
    import numpy as np

    from baselines.rest_datastore import FILES, _tokenize_corpus, default_datastore_dir, load_datastore, tokenizer_hash
    from evaluation.corpus import corpus_path
    from evaluation.tools.datastore import load_tokenizer

    manifest = read_manifest(bundle)
    rest = manifest.get("rest")
    if not rest:
        say("rest: not in this bundle (built with --rest-conversations 0)")
        return
    tokenizer = load_tokenizer(rest["model"])
    tok_hash = tokenizer_hash(tokenizer)
    with corpus_path(None) as corpus:
        corpus_hash = _file_sha256(corpus)
        if corpus_hash != rest["corpus_sha256"]:
            raise BundleError(f"the installed ShareGPT corpus has sha256 {corpus_hash[:16]}..., the datastore was "
                              f"built from {rest['corpus_sha256'][:16]}...")
        target = default_datastore_dir(tok_hash, corpus_hash, rest["options"])
        existing = target / "manifest.json"
        if existing.is_file():
            have = json.loads(existing.read_text())
            if (have.get("tokenizer_sha256"), have.get("corpus_sha256"), have.get("options")) == (
                    tok_hash, corpus_hash, rest["options"]):
                load_datastore(target, tokenizer)
                say(f"rest: datastore already present at {target}")
                return
        entries = {Path(e["path"]).name: e for e in manifest["files"] if e["path"].startswith(rest["folder"] + "/")}
        target.mkdir(parents=True, exist_ok=True)
        how = "built with the same tokenizer serialization"
        # As rest_datastore writes one: data files first, the manifest last (its presence marks a complete one).
        with tempfile.TemporaryDirectory(dir=target) as tmp:
            for name in (*FILES, "build.json", "manifest.json"):
                join_file(bundle, entries[name], Path(tmp) / name)
            if tok_hash != rest["tokenizer_sha256"]:
                tokens, starts, _info = _tokenize_corpus(tokenizer, corpus, rest["max_conversations"], False)
                same = (np.array_equal(tokens, np.load(Path(tmp) / "tokens.npy"))
                        and np.array_equal(starts, np.load(Path(tmp) / "starts.npy")))
                if not same:
                    shutil.rmtree(tmp, ignore_errors=True)
                    message = (f"this node's {rest['model']} tokenizer encodes the corpus differently from the one "
                               "the datastore was built with")
                    if importable("pydivsufsort"):
                        say(f"rest: {message}; REST builds its own datastore on first use (pydivsufsort is installed)")
                        return
                    raise BundleError(f"{message}, and pydivsufsort is not installed to build another")
                data = json.loads((Path(tmp) / "manifest.json").read_text())
                data["tokenizer_sha256"] = tok_hash
                (Path(tmp) / "manifest.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
                how = (f"re-keyed: this node's tokenizer serializes to {tok_hash[:16]}... (the build's: "
                       f"{rest['tokenizer_sha256'][:16]}...) and encodes the {rest['max_conversations']} "
                       "conversations to the same ids")
            for name in (*FILES, "build.json"):
                os.replace(Path(tmp) / name, target / name)
            os.replace(Path(tmp) / "manifest.json", target / "manifest.json")
    store = load_datastore(target, tokenizer)
    say(f"rest: datastore of {rest['max_conversations']} conversations ({len(store.tokens):,} tokens) placed at "
        f"{target} ({how})")


# ----------------------------------------------------------------------------------------------- command line
def one_line_errors(action) -> int:
    """Run `action()`; any failure is one line on stderr, `error: ...`, and exit status 2 (else 0)."""
    try:
        action()
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 2
    except Exception as exc:  # the harness's own errors (HarnessError) and anything unexpected: one line too
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"error: {type(exc).__name__}: {first}" if type(exc).__name__ != "HarnessError" else f"error: {first}",
              file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("verify", "install-wheels", "place-rest"):
        sub.add_parser(name).add_argument("bundle")
    one = sub.add_parser("install-wheel")
    one.add_argument("bundle")
    one.add_argument("path")
    one.add_argument("label")
    one.add_argument("--check-file", default=None)
    join = sub.add_parser("join")
    join.add_argument("bundle")
    join.add_argument("path")
    join.add_argument("out")
    sub.add_parser("convert")
    get = sub.add_parser("get")  # install.sh reads the manifest with it: `get BUNDLE target.python`
    get.add_argument("bundle")
    get.add_argument("key")
    args = parser.parse_args(argv)
    return one_line_errors(lambda: run_command(args))


def run_command(args) -> None:
    if args.command == "verify":
        count, total = verify_bundle(Path(args.bundle))
        manifest = read_manifest(Path(args.bundle))
        say(f"bundle: {count} files ({human(total)}) match MANIFEST.json; harness "
            f"{manifest['harness']['commit'][:12]}, CPython {manifest['target']['python']}")
        for note in manifest["notes"]:
            say(f"  note: {note}")
    elif args.command == "install-wheels":
        install_wheels(Path(args.bundle))
    elif args.command == "install-wheel":
        install_single(Path(args.bundle), args.path, args.label, args.check_file)
    elif args.command == "join":
        bundle = Path(args.bundle)
        join_file(bundle, entry_for(read_manifest(bundle), args.path), Path(args.out))
    elif args.command == "convert":
        convert()
    elif args.command == "get":
        value = read_manifest(Path(args.bundle))
        for key in args.key.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        print("" if value is None else value)
    elif args.command == "place-rest":
        place_rest(Path(args.bundle))


if __name__ == "__main__":
    sys.exit(main())
