# make help: list the targets.
# The interpreter every target runs: .venv, built by `make setup` from the pinned requirements. PY=python3 (or any
# interpreter's path) uses that environment as it is, e.g. a GPU node's own CUDA torch: no venv is created and
# nothing is downloaded; `make setup` then checks it and names each missing package with the command that
# installs it (on an offline node: `bash <bundle>/install.sh`, see offline-bundle).
VENV_PY := .venv/bin/python
PY      ?= $(VENV_PY)
MODEL   ?= smollm2-135m
# The default benchmark slice (about 13 minutes a repeat on 2 CPU cores); `make bench QUESTIONS=null MAX_NEW=1024 WARMUP=3`
# is the full Spec-Bench run.
QUESTIONS ?= 1
MAX_NEW   ?= 128
WARMUP    ?= 1
# Whole-run repeats, run in rounds (every method once, then every method again), each round starting a third
# of the way further down the list, so that drift of the machine over a round does not always fall on the same
# methods (vanilla included); finished repeats are resumed, not redone.
REPEATS   ?= 3
# sequential: one method after the other (run.py -m); interleaved: every method answers each question before the
# next question starts (evaluation/interleave.py), so a machine whose speed drifts over minutes drifts alike for
# all of them and the per-question paired tests compare like with like.
SCHEDULE  ?= sequential
# The draft budget: off (every proposed node is verified, as published) or auto (evaluation/engine/budget.py).
BUDGET    ?= off
# More Hydra overrides for every run, e.g. ARGS="model.path=/models/vicuna-7b-v1.3 run.device=cuda".
ARGS      ?=
# Decoding temperature: 0 is greedy (Spec-Bench); above 0 every method samples through the engine's exact rule.
TEMPERATURE ?= 0
# Every method config in conf/method, vanilla first (each is compared with vanilla). Trained-draft methods
# (gumiho*, eagle2) join once a draft for MODEL is committed under gumiho/drafts/MODEL.
TRAINED   := $(if $(wildcard gumiho/drafts/$(MODEL)/config.json),,| grep -v -e '^gumiho' -e '^eagle2')
METHODS ?= vanilla,$(shell ls conf/method | sed -n 's/\.yaml$$//p' | grep -vx vanilla $(TRAINED) | paste -sd, -)

.PHONY: help setup setup-gpu check-environment setup-cluster data datastore test bench report figures ablations exactness \
	bench-engine gpu-check offline-bundle offline-check half-precision clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

setup: $(if $(filter $(VENV_PY),$(PY)),.venv/.installed,check-environment)  ## create .venv with the pinned dependencies (with PY=...: only check that interpreter)

.venv/.installed: requirements.txt requirements-nodeps.txt
	python3 -m venv .venv
	$(VENV_PY) -m pip install --quiet -r requirements.txt
	$(VENV_PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	touch $@

check-environment:  ## name what PY lacks (one line per package, with its install command) and check versions
	$(PY) -m evaluation.versions

# A GPU machine with a network: PyPI's torch 2.13.0 for Linux x86_64 is the CUDA 13 build (its CUDA libraries come
# as nvidia-* wheels; the driver must support CUDA 13). For an older driver, take the CUDA 12 build from PyTorch's
# own index: make setup-gpu TORCH_INDEX=https://download.pytorch.org/whl/cu126
TORCH_INDEX ?=
setup-gpu:  ## create .venv with the CUDA build of the pinned torch, then the other pins
	python3 -m venv .venv
	$(VENV_PY) -m pip install --quiet $(shell grep -m1 '^torch==' requirements.txt) \
		$(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(VENV_PY) -m pip install --quiet -r requirements.txt
	$(VENV_PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	$(VENV_PY) -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
	touch .venv/.installed

setup-cluster: .venv/.cluster-installed  ## add Ray and submitit (run.workers, hydra/launcher=slurm or ray_cluster)

.venv/.cluster-installed: .venv/.installed requirements-cluster.txt requirements-cluster-nodeps.txt
	$(PY) -m pip install --quiet -r requirements-cluster.txt -c requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-cluster-nodeps.txt
	touch $@

data: setup  ## put the question sets under data/ (checked by sha256)
	$(PY) -m evaluation.data

datastore: setup  ## build REST's ShareGPT datastore for MODEL's tokenizer (cached; about 3 minutes)
	$(PY) -m baselines.rest_datastore --model $(MODEL)

test: setup data  ## run the test suite (CPU, real embedded model)
	$(PY) -m pytest

bench: setup data  ## every method on a Spec-Bench slice, REPEATS times, then the report
	for round in $$(seq 1 $(REPEATS)); do \
		order=$$(echo $(METHODS) | tr , '\n' | awk -v r=$$round '{m[NR-1] = $$0} END {s = int((r - 1) * NR / 3) % NR; \
			for (i = 0; i < NR; i++) printf "%s%s", (i ? "," : ""), m[(i + s) % NR]}'); \
		settings="model=$(MODEL) bench.questions_per_subtask=$(QUESTIONS) bench.max_new_tokens=$(MAX_NEW) \
			bench.warmup=$(WARMUP) bench.temperature=$(TEMPERATURE) run.repeats=$$round \
			run.draft_budget=$(BUDGET) run.report=false $(ARGS)"; \
		case "$(SCHEDULE)" in \
			sequential) $(PY) run.py -m method=$$order $$settings || exit 1;; \
			interleaved) $(PY) -m evaluation.interleave $$(echo $$order | tr , ' ' | sed 's/[^ ]*/method=&/g') \
				-- $$settings || exit 1;; \
			*) echo "error: bad value for SCHEDULE: '$(SCHEDULE)' (sequential or interleaved)" >&2; exit 2;; \
		esac; \
	done
	$(PY) -m evaluation.report

report: setup  ## rebuild results/report.md and .csv from the saved runs
	$(PY) -m evaluation.report

figures: setup  ## Table 1, the published Spec-Bench table and the figures (results/figures) from the saved runs
	$(PY) -m evaluation.figures

ABLATIONS := $(sort $(basename $(notdir $(wildcard conf/experiment/ablation_*.yaml))))
ablations: setup data  ## LogitSpec ablation sweeps (conf/experiment/ablation_*.yaml) into results/ablations
	$(PY) run.py experiment=ablation_baseline
	for sweep in $(filter-out ablation_baseline,$(ABLATIONS)); do $(PY) run.py experiment=$$sweep || exit 1; done
	$(PY) -m evaluation.report --results results/ablations/runs --out results/ablations
	$(PY) -m evaluation.figures --results results/ablations/runs --out results/ablations/figures

exactness: setup  ## the goodness-of-fit check of every method's sampled output (results/sampling/exactness.csv)
	$(PY) -m evaluation.exactness

bench-engine: setup  ## forward latency against new tokens, and our vanilla loop against generate()
	$(PY) -m evaluation.bench_engine

# A machine with a GPU: the lossless tests on CUDA in float32, a float16 benchmark slice with its match rate and the
# logit margins where outputs first differ, and the engine's latency curve, into results/gpu/<gpu name>/.
gpu-check: setup  ## the CUDA checks, for a machine with a GPU (sized for well under 10 minutes on one H200)
	$(PY) -m evaluation.gpu_check

# Everything an offline GPU node lacks, in one folder to copy there (README, "GPU machines and offline nodes"):
# wheels for BUNDLE_PYTHON, the question sets, the embedded model in parts of at most PART_MB, REST's datastore for
# the GPU slice, and install.sh. Built where there is a network (a login node, a laptop).
BUNDLE        ?= dist/offline-bundle
BUNDLE_PYTHON ?= 3.12
PART_MB       ?= 60
offline-bundle: setup data  ## the folder to copy to an offline node: wheels, data, model, REST datastore, install.sh
	$(PY) -m evaluation.offline_bundle --out $(BUNDLE) --python-version $(BUNDLE_PYTHON) --part-mb $(PART_MB)

offline-check:  ## CI's check of an offline node: a fresh venv with torch + transformers 5.17 + the bundle only
	bash .ci/offline-check

half-precision: setup data  ## every method in bfloat16 on the CPU against bfloat16 vanilla (results/engine)
	$(PY) -m evaluation.half_precision

clean:  ## remove scratch results (never the saved runs)
	rm -rf results/scratch .pytest_cache

# The draft for MODEL (conf/train/<MODEL>.yaml when present, else conf/train/default.yaml); a rerun resumes.
# Budget and options: make train-gumiho TRAIN_ARGS="train.max_minutes=120"
TRAIN_RECIPE = $(if $(wildcard conf/train/$(MODEL).yaml),$(MODEL),default)
.PHONY: train-gumiho
train-gumiho: setup data  ## train a Gumiho draft for MODEL into gumiho/drafts/MODEL (resumable)
	$(PY) -m gumiho.train model=$(MODEL) train=$(TRAIN_RECIPE) $(TRAIN_ARGS)
