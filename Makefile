# The README's commands. Each bootstraps .venv when it is missing or pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_OUT ?= runs/demo/episode.gif

.PHONY: train test lint benchmark-env venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

# Until the PPO trainer lands, `make train` runs the environment demo: one episode of the
# scripted `eager` policy on a procedural 32x32 map, written as a GIF.
train: $(STAMP)
	$(PY) scripts/play_episode.py --policy eager --map-size 32 --max-steps 300 --seed 2 --out $(DEMO_OUT)

# pytest exits 5 when it collected no test: that is a failure here, not a pass.
test: $(STAMP) lint
	@$(PY) -m pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$status

lint: $(STAMP)
	$(VENV)/bin/ruff check .

benchmark-env: $(STAMP)
	$(PY) scripts/benchmark_env.py --json docs/benchmarks/env_cpu.json
