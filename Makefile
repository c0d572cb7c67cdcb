# hydroagent-hpc: every target installs what it needs into .venv by itself.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build. On this project's machines
# 2.13.0 is a local CPU wheel; elsewhere set TORCH_SPEC (e.g. a CUDA build on a GPU cluster).
TORCH_SPEC ?= torch==2.13.0
# Numba compiles the simulator kernels once and caches them here.
export NUMBA_CACHE_DIR ?= $(CURDIR)/.cache/numba
DEMO_DIR ?= results/demo
TRAIN_DEMO_DIR ?= results/train-demo
TRAIN_BENCH_DIR ?= results/learning

.PHONY: help venv demo train-demo train-bench test lint bench gpu-check clean

help:
	@echo "make demo   build the four synthetic demo basins and simulate each (no network, no GPU)"
	@echo "make train-demo  the whole recipe (basins, teacher, SFT, GRPO, evaluation, report) with the tiny model on CPU"
	@echo "make train-bench  does the recipe learn? 3 model x 3 data seeds, 96 held-out basins, resumable (~1.9 h on 2 cores) -> results/learning/report.md"
	@echo "make test   the test suite without the tests marked slow (minutes); make test TESTS=all runs every test"
	@echo "make lint   ruff (lint + import order) and mypy (strict for core, env, store, train)"
	@echo "make bench  run the simulator, metrics, report and HPC benchmarks"
	@echo "make gpu-check  on a GPU node: memory plan, one SFT and one GRPO step, the F1/F2 checks -> results/gpu-check.json"

# The install goes through uv when it can be had (about 10 s instead of pip's 100), told pip's own settings
# (find-links, extra indexes, constraints; best match over every index, as pip chooses: the same versions);
# without uv, or if uv fails, pip installs the same. Bytecode is compiled at install, as pip does: uv leaves it
# out, and where PYTHONDONTWRITEBYTECODE is set (it is on the machines this was measured on) every process
# that imports torch and transformers compiles them from source again (5-8 s; the suite starts hundreds).
PIP_SETTING = $$($(PY) -m pip config list 2>/dev/null | sed -n "s/^\(global\|:env:\)\.$(1)='\(.*\)'$$/\2/p" | head -n 1)
$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	($(PY) -m pip install --quiet uv && \
	  UV_FIND_LINKS="$(call PIP_SETTING,find-links)" UV_EXTRA_INDEX_URL="$(call PIP_SETTING,extra-index-url)" \
	  UV_CONSTRAINT="$(call PIP_SETTING,constraint)" UV_INDEX_STRATEGY=unsafe-best-match \
	  $(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) '$(TORCH_SPEC)' -e '.[dev]') || \
	  { echo "uv could not install the environment: pip does" >&2; \
	    $(PY) -m pip install --quiet '$(TORCH_SPEC)' && $(PY) -m pip install --quiet -e '.[dev]'; }
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hydroagent demo --out $(DEMO_DIR)

train-demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/hydroagent pipeline run data/pipelines/demo.yaml --run-dir $(TRAIN_DEMO_DIR) --workers 2

train-bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m hydroagent_hpc.bench.learning --out $(TRAIN_BENCH_DIR) --jobs 2

# make test leaves out the tests marked `slow` (multi-process and distributed training, Slurm and MPI round
# trips, learning runs, long fuzzing): a few minutes on 2 cores. make test TESTS=all runs every test (.ci/run does).
TESTS ?= fast
ifeq ($(TESTS),all)
PYTEST_SELECT :=
else ifeq ($(TESTS),fast)
PYTEST_SELECT := -m "not slow"
else
$(error TESTS=$(TESTS): use TESTS=fast (the default, without the tests marked slow) or TESTS=all)
endif

# JOBS=N runs the tests in N processes (pytest-xdist; default 2, JOBS=1 runs them in this process): each file
# on one process, the longest first, the Slurm and MPI tests one
# at a time (tests/conftest.py SHARED_MACHINERY).
JOBS ?= 2
# PYTEST_ARGS passes more options to pytest (e.g. PYTEST_ARGS=--durations=25, as .ci/run does).
PYTEST_ARGS ?=
ifeq ($(JOBS),1)
PYTEST_JOBS :=
else
PYTEST_JOBS := -n $(JOBS) --dist loadgroup --no-loadscope-reorder
endif

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q $(PYTEST_JOBS) $(PYTEST_SELECT) $(PYTEST_ARGS) tests; rc=$$?; \
	if [ "$(TESTS)" = fast ]; then echo "make test: the tests marked slow (training processes, Slurm, MPI, learning runs," \
	"long fuzzing) were left out; run every test with: make test TESTS=all  (as .ci/run does)"; fi; exit $$rc

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) -m hydroagent_hpc.bench

gpu-check: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m hydroagent_hpc.bench.gpu_check --out results/gpu-check.json

clean:
	rm -rf $(VENV) .cache results/demo results/train-demo results/learning
