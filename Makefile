# The two commands: `make run` and `make test`.  Both create .venv and
# install the project into it first; nothing else is needed beyond
# Python 3.11+, Java 17 (for the ZooKeeper and Spark tests) and apt (the
# alert-rule tests fetch promtool from Debian's prometheus package into
# .venv on first use: tests/support/promtool.py).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CONFIG ?= configs/local.toml
SEEDS  ?= 2000
PYTEST_ARGS ?=

.PHONY: install test lint run sim clean

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -e '.[dev,spark]'
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(BIN)/ruff check .

test: install lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

run: install
	$(BIN)/bkctl up --config $(CONFIG)

sim: install
	$(BIN)/python -m tests.sim --seeds $(SEEDS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
