# The README's commands. Each bootstraps .venv when it is missing or pyproject.toml or
# constraints.txt changed; .venv gets the versions constraints.txt pins (the ranges' lower bounds).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TRAIN_ARGS ?=
GATES_ARGS ?=
GATES := $(PY) scripts/validation/validate_gates.py --case all --jax-platforms cpu

.PHONY: train test test-fast lint gates benchmark-env benchmark-train results venv

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

# The main job on its CPU-sized preset: procedural maps, no dataset, W&B off. Extra flags:
# make train TRAIN_ARGS="--total_timesteps 100000"
train: $(STAMP)
	$(PY) train_mixed.py --config cpu_demo $(TRAIN_ARGS)

# ruff, then pytest, which runs every validation gate too (tests/test_validation.py calls each
# case, and the script's own command line is tested there), so `make gates` is not run again.
# pytest runs two workers (the machine's two cores; XLA compiles are mostly single-threaded),
# each test file on one worker so that its session fixtures compile once, the files in
# tests/conftest.py's order (the slow ones first, longest first) rather than pytest-xdist's
# (by number of tests), so that both workers end together. pytest exits 5 when it collected
# no test: that is a failure here, not a pass. A worker that crashes is not replaced: the run
# fails at once instead of hanging on a rescheduled file.
# `make test-fast` leaves out the tests marked slow (pytest -m "not slow"): most of the
# tests in about 2 minutes, for the edit-test loop; `make test` (and so CI) runs them all.
PYTEST_ARGS ?= -n 2 --dist loadfile --no-loadscope-reorder --max-worker-restart 0
PYTEST_RUN = status=$$?; \
	if [ $$status -eq 5 ]; then echo "make $@: pytest collected no tests" >&2; exit 1; fi; \
	exit $$status
test: $(STAMP) lint
	@$(PY) -m pytest $(PYTEST_ARGS); $(PYTEST_RUN)

test-fast: $(STAMP) lint
	@$(PY) -m pytest -m "not slow" $(PYTEST_ARGS); $(PYTEST_RUN)

# The CPU validation gates before a launch (docs/VALIDATION.md). Extra flags:
# make gates GATES_ARGS="--dataset-path data/maps64 --json gates.json"
gates: $(STAMP)
	$(GATES) $(GATES_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

benchmark-env: $(STAMP)
	$(PY) scripts/benchmark_env.py --json docs/benchmarks/env_cpu.json

benchmark-train: $(STAMP)
	$(PY) scripts/benchmark_train.py --config cpu_demo --json docs/benchmarks/train_cpu_demo.json
	$(PY) scripts/benchmark_train.py --config solo_excavator --set num_devices=1 \
		--set num_envs_per_device=64 --set precision=float32 \
		--json docs/benchmarks/train_solo_scaled.json

# docs/RESULTS.md from scratch: the standard-task table (7 gymnax tasks x 3 seeds at the
# published budgets) and the cpu_demo seeds with curves and GIFs, under results/ (hours on
# 2 cores). make results RESULTS_ARGS=--quick checks the whole pipeline in minutes.
RESULTS_ARGS ?=
results: $(STAMP)
	$(PY) scripts/run_results.py $(RESULTS_ARGS)
