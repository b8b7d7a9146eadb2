# Every target builds its own virtualenv from pyproject.toml, so a fresh
# machine needs nothing but python3 (and root plus Debian's apt for the
# end-to-end tests, which fetch containerd themselves).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint gen check-gen bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/nri-midbatch replay examples/recordings/demo.jsonl --via-socket

test: lint
	$(BIN)/python -m pytest

# The behaviour suite: no real containerd, no generated-code, packaging, docs, benchmark or
# promtool checks.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m 'not (e2e or generated or packaging or docs or bench or monitoring)'

lint: $(STAMP)
	$(BIN)/ruff check nri_midbatch tests scripts bench
	$(BIN)/ruff format --check nri_midbatch tests scripts bench
	$(BIN)/mypy nri_midbatch tests bench scripts/*.py

gen: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

check-gen: $(STAMP)
	$(BIN)/python scripts/gen_protos.py --check

# The plugin as a real process against a benchmark runtime (docs/performance.md);
# e.g. make bench BENCH_ARGS='--loop asyncio' or BENCH_ARGS=--quick.
BENCH_ARGS ?=
bench: $(STAMP)
	$(BIN)/python -m bench --json bench-results.json $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
