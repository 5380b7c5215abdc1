# make help: list the targets.
# The interpreter every target runs: .venv, built by `make setup` from the pinned requirements. PY=python3 (or any
# interpreter's path) uses that environment as it is, e.g. a GPU node's own CUDA torch: no venv is created and
# nothing is downloaded; `make setup` then checks it and names each missing package with the command that
# installs it (on an offline node: `bash <bundle>/install.sh`, see offline-bundle).
VENV_PY := .venv/bin/python
PY      ?= $(VENV_PY)
MODEL   ?= smollm2-135m
# The default benchmark slice: one question per subtask, 128 new tokens, every method once, interleaved (about
# 40 minutes on 2 CPU cores for 18 methods, more than half of it the trained drafts). `make bench REPEATS=3` is the
# statistical run; `make bench QUESTIONS=null MAX_NEW=1024 WARMUP=3` the full Spec-Bench run.
QUESTIONS ?= 1
MAX_NEW   ?= 128
WARMUP    ?= 1
REPEATS   ?= 1
# interleaved: every method answers each question before the next question starts, in one process with one loaded
# model and one progress bar (evaluation/run/interleave.py), so a machine whose speed drifts over minutes drifts
# alike for all methods and the per-question paired tests compare like with like. sequential: one method after the
# other (run.py -m), in rounds when REPEATS > 1, each round starting a third of the way further down the list.
SCHEDULE  ?= interleaved
# The draft budget: off (every proposed node is verified, as published) or auto (evaluation/engine/budget/).
BUDGET    ?= off
# More Hydra overrides for every run, e.g. ARGS="model.path=/models/vicuna-7b-v1.3 run.device=cuda".
ARGS      ?=
# Decoding temperature: 0 is greedy (Spec-Bench); above 0 every method samples through the engine's exact rule.
TEMPERATURE ?= 0
# Where a bench set goes: its runs in $(OUT)/runs, the report in $(OUT), the tables and figures in $(OUT)/figures
# (make bench OUT=results/reference && make figures OUT=results/reference keeps a set apart from the default one).
OUT       ?= results
# The method configs to run, comma-separated; empty: every config in conf/method, vanilla first, the trained-draft
# ones once a draft for MODEL is committed (`python -m evaluation.catalog bench-settings MODEL`).
METHODS   ?=

.PHONY: help setup setup-gpu check-environment setup-cluster data datastore test bench report figures ablations exactness upstream-parity \
	bench-engine gpu-check reproduce-specbench fetch-checkpoints offline-bundle offline-check half-precision results-page clean bench-families

help:  ## [instant] list the targets, with their duration on 2 CPU cores
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'
	@for f in $(FAMILIES); do printf "  %-18s %s\n" "train-$$f" "[as train] make train FAMILY=$$f"; done

setup: $(if $(filter $(VENV_PY),$(PY)),.venv/.installed,check-environment)  ## [~3 min, once] create .venv with the pinned dependencies (PY=...: only check that interpreter)

.venv/.installed: requirements.txt requirements-nodeps.txt
	python3 -m venv .venv
	$(VENV_PY) -m pip install --quiet -r requirements.txt
	$(VENV_PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	touch $@

check-environment:  ## [seconds] name what PY lacks (one line per package, with its install command), check versions
	$(PY) -m evaluation.versions

# A GPU machine with a network: PyPI's torch 2.13.0 for Linux x86_64 is the CUDA 13 build (its CUDA libraries come
# as nvidia-* wheels; the driver must support CUDA 13). For an older driver, take the CUDA 12 build from PyTorch's
# own index: make setup-gpu TORCH_INDEX=https://download.pytorch.org/whl/cu126
TORCH_INDEX ?=
setup-gpu:  ## [download-bound] create .venv with the CUDA build of the pinned torch, then the other pins
	python3 -m venv .venv
	$(VENV_PY) -m pip install --quiet $(shell grep -m1 '^torch==' requirements.txt) \
		$(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(VENV_PY) -m pip install --quiet -r requirements.txt
	$(VENV_PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	$(VENV_PY) -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
	touch .venv/.installed

setup-cluster: .venv/.cluster-installed  ## [~1 min] add Ray and submitit (run.workers, hydra/launcher=slurm or ray_cluster)

.venv/.cluster-installed: .venv/.installed requirements-cluster.txt requirements-cluster-nodeps.txt
	$(PY) -m pip install --quiet -r requirements-cluster.txt -c requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-cluster-nodeps.txt
	touch $@

data: setup  ## [seconds] put the question sets under data/ (checked by sha256)
	$(PY) -m evaluation.tools.data

datastore: setup  ## [~3 min, cached] build REST's ShareGPT datastore for MODEL's tokenizer
	$(PY) -m evaluation.tools.datastore --model $(MODEL)

test: setup data  ## [~40 min on 2 cores] the test suite (CPU, real embedded model)
	$(PY) -m pytest

bench: setup data  ## [~40 min] every method on a Spec-Bench slice (REPEATS=3: the statistical run), then the report
	@methods="$(METHODS)"; [ -n "$$methods" ] || methods=$$($(PY) -m evaluation.catalog bench-settings $(MODEL)) || exit 2; \
	settings="model=$(MODEL) bench.questions_per_subtask=$(QUESTIONS) bench.max_new_tokens=$(MAX_NEW) \
		bench.warmup=$(WARMUP) bench.temperature=$(TEMPERATURE) run.draft_budget=$(BUDGET) run.report=false \
		run.results_dir=$(OUT)/runs $(ARGS)"; \
	case "$(SCHEDULE)" in \
		interleaved) echo "$(PY) -m evaluation.run.interleave ... -- $$settings run.repeats=$(REPEATS)"; \
			$(PY) -m evaluation.run.interleave $$(echo $$methods | tr , ' ' | sed 's/[^ ]*/method=&/g') \
				-- $$settings run.repeats=$(REPEATS) || exit 1;; \
		sequential) for round in $$(seq 1 $(REPEATS)); do \
				order=$$(echo $$methods | tr , '\n' | awk -v r=$$round '{m[NR-1] = $$0} END {s = int((r - 1) * NR / 3) % NR; \
					for (i = 0; i < NR; i++) printf "%s%s", (i ? "," : ""), m[(i + s) % NR]}'); \
				$(PY) run.py -m method=$$order $$settings run.repeats=$$round || exit 1; \
			done;; \
		*) echo "error: bad value for SCHEDULE: '$(SCHEDULE)' (interleaved or sequential)" >&2; exit 2;; \
	esac
	$(PY) -m evaluation.report --results $(OUT)/runs --out $(OUT)

# Spec-Bench's Table 1 for MODEL: its exact settings (all 480 questions, 1,024 new tokens, 3 warm-ups, greedy, float16
# on a GPU, batch 1), every method with a checkpoint for MODEL (conf/checkpoints.yaml) interleaved with vanilla. It
# prints the plan and checks every checkpoint first, and ends with Table 1 beside the published rows. DRY_RUN=1: the
# plan and the checks only. Into results/specbench/<MODEL>/ (OUT=... elsewhere).
DRY_RUN ?=
reproduce-specbench: setup data  ## [GPU: hours; the plan prints an estimate] Spec-Bench's exact settings for MODEL, Table 1 beside the published rows
	$(PY) -m evaluation.tools.reproduce_specbench --model $(MODEL) --repeats $(REPEATS) \
		$(if $(filter-out results,$(OUT)),--out $(OUT)) $(if $(DRY_RUN),--dry-run) -- $(ARGS)

# Where there is a network: MODEL's weights, every checkpoint paired with it, the question sets and REST's datastore,
# into DEST (a hub cache and an env.sh to source on an offline node); resumable.
DEST ?= dist/checkpoints
fetch-checkpoints: setup data  ## [download-bound] MODEL's target, paired checkpoints, questions and REST datastore into DEST (resumable)
	$(PY) -m evaluation.tools.fetch_checkpoints --model $(MODEL) --dest $(DEST)/$(MODEL)

# The trained-draft families side by side on the bench slice (interleaved, one process), with EAGLE-2's and Gumiho's
# reduced draft vocabularies (method.draft_vocab); the report set goes to results/families/.
FAMILY_VOCABS ?= 4096 8192 16384
bench-families: setup data  ## [~45 min] every trained family's methods (conf/family/) where a draft is there (each also with the draft budget), the draft-vocabulary sweep, on the bench slice
	pattern="^($$($(PY) -m evaluation.families methods | tr ' ' '|'))$$"; \
	families=$$($(PY) -m evaluation.catalog bench-settings $(MODEL) | tr , '\n' | grep -E "$$pattern"); set --; \
	for f in $$families; do set -- "$$@" "method=$$f"; \
		[ $$f = gumiho-serial ] || set -- "$$@" "method=$$f run.draft_budget=auto"; done; \
	$(PY) -m evaluation.run.interleave method=vanilla "$$@" \
		$(foreach n,$(FAMILY_VOCABS),"method=eagle2 method.draft_vocab=$(n)") "method=gumiho method.draft_vocab=8192" \
		-- model=$(MODEL) bench.questions_per_subtask=$(QUESTIONS) bench.max_new_tokens=$(MAX_NEW) \
		bench.warmup=$(WARMUP) run.results_dir=results/runs/families run.report=false $(ARGS)
	$(PY) -m evaluation.report --results results/runs/families --out results/families
	$(PY) -m evaluation.tools.family_table --report results/families
	$(PY) -m evaluation.report.figures --results results/runs/families --out results/families/figures

report: setup  ## [seconds] rebuild results/report.md and .csv from the saved runs (OUT=...: another set's)
	$(PY) -m evaluation.report --results $(OUT)/runs --out $(OUT)

figures: setup  ## [<1 min] Table 1, the published Spec-Bench table and the figures (results/figures; OUT=...)
	$(PY) -m evaluation.report.figures --results $(OUT)/runs --out $(OUT)/figures

ABLATIONS := $(sort $(basename $(notdir $(wildcard conf/experiment/ablation_*.yaml))))
ablations: setup data  ## [~45 min] LogitSpec ablation sweeps (conf/experiment/ablation_*.yaml) into results/ablations
	$(PY) run.py experiment=ablation_baseline
	for sweep in $(filter-out ablation_baseline,$(ABLATIONS)); do $(PY) run.py experiment=$$sweep || exit 1; done
	$(PY) -m evaluation.report --results results/ablations/runs --out results/ablations
	$(PY) -m evaluation.report.figures --results results/ablations/runs --out results/ablations/figures

# Clones for `make upstream-parity`: hemingkx/Spec-Bench at fd2c1cd (required), smart-lty/LogitSpec at 659bba9 and
# AMD-AIG-AIMA/Gumiho at 9a1bc87 (optional: their methods are compared when given).
SPEC_BENCH ?=
LOGITSPEC ?=
GUMIHO ?=
upstream-parity: setup data  ## [~50 min; side environments once] our methods beside their upstream code, step for step (SPEC_BENCH=<clone> [LOGITSPEC=<clone>] [GUMIHO=<clone>])
	@[ -n "$(SPEC_BENCH)" ] || { echo "error: give SPEC_BENCH=<a clone of hemingkx/Spec-Bench at fd2c1cd>" >&2; exit 2; }
	$(PY) -m evaluation.tools.upstream_parity --spec-bench $(SPEC_BENCH) $(if $(LOGITSPEC),--logitspec $(LOGITSPEC)) \
		$(if $(GUMIHO),--gumiho $(GUMIHO))

exactness: setup  ## [~3 min] goodness-of-fit of every method's sampled output (results/sampling/exactness.csv)
	$(PY) -m evaluation.tools.exactness

bench-engine: setup  ## [~6 min] forward latency against new tokens, our vanilla loop against generate(), and on a CPU each kernel path (float32/bfloat16, prepacked or not, 1 and all threads)
	$(PY) -m evaluation.tools.bench_engine
	@if $(PY) -c "import sys, torch; sys.exit(torch.cuda.is_available())"; then $(PY) -m evaluation.tools.cpu_paths; fi

# A machine with a GPU: the lossless tests on CUDA in float32, a float16 benchmark slice with its match rate and the
# logit margins where outputs first differ, and the engine's latency curve, into results/gpu/<gpu name>/.
gpu-check: setup  ## [GPU only; <10 min on one H200, estimated] the CUDA checks into results/gpu/<gpu name>/
	$(PY) -m evaluation.tools.gpu_check

# Everything an offline GPU node lacks, in one folder to copy there (README, "GPU machines and offline nodes"):
# wheels for BUNDLE_PYTHON, the question sets, the embedded model in parts of at most PART_MB, REST's datastore for
# the GPU slice, and install.sh. Built where there is a network (a login node, a laptop).
BUNDLE        ?= dist/offline-bundle
BUNDLE_PYTHON ?= 3.12
PART_MB       ?= 60
offline-bundle: setup data  ## [~5 min] the folder to copy to an offline node: wheels, data, model, REST datastore
	$(PY) -m evaluation.tools.offline_bundle --out $(BUNDLE) --python-version $(BUNDLE_PYTHON) --part-mb $(PART_MB)

offline-check:  ## [~8 min] CI's offline-node check: a fresh venv, transformers 5.17 and the bundle only
	bash .ci/offline-check

half-precision: setup data  ## [~4 min] every method in bfloat16 on the CPU against bfloat16 vanilla (results/engine)
	$(PY) -m evaluation.tools.half_precision

results-page:  ## [seconds] refresh the tables docs/results.md copies from results/ (--check: only compare)
	$(PY) -m evaluation.tools.results_page

# Only what nothing resumes from: each entry of results/scratch/ goes unless it holds a training state (state.pt)
# or a run's answers (answers.jsonl); every path removed or kept is printed. Training states live in results/train/.
clean:  ## [instant] remove scratch that nothing resumes from (never saved runs or training states; prints each path)
	@for path in results/scratch/* results/scratch/.[!.]* .pytest_cache; do \
		[ -e "$$path" ] || [ -L "$$path" ] || continue; \
		if [ -n "$$(find "$$path" \( -name state.pt -o -name answers.jsonl \) -print -quit)" ]; then \
			echo "kept $$path (a training state or run answers: resumable)"; \
		else \
			rm -rf -- "$$path" && echo "removed $$path"; \
		fi; \
	done

# A draft of FAMILY for MODEL: the recipe conf/train/<MODEL>.yaml when present, else conf/train/default.yaml, with
# the family's own defaults laid over it (conf/family/<FAMILY>.yaml); a rerun resumes. Budget and options:
# make train FAMILY=eagle TRAIN_ARGS="train.max_minutes=120". make train-<family> is the same for each family.
FAMILY ?= gumiho
FAMILIES := $(sort $(basename $(notdir $(wildcard conf/family/*.yaml))))
TRAIN_ARGS ?=
TRAIN_RECIPE = $(if $(wildcard conf/train/$(MODEL).yaml),$(MODEL),default)
.PHONY: train $(addprefix train-,$(FAMILIES))
train: setup data  ## [train.max_minutes: 120 for smollm2-135m] train a draft of FAMILY (conf/family/) for MODEL (resumable)
	$(PY) -m evaluation.tools.train family=$(FAMILY) model=$(MODEL) train=$(TRAIN_RECIPE) $(TRAIN_ARGS)

$(addprefix train-,$(FAMILIES)): train-%:
	$(MAKE) train FAMILY=$*
