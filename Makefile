# The two commands: `make run` and `make test`. Each creates .venv and installs on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: run test install install-all system-deps lint bench clean

# Debian packages the suite drives (package or package:command); installed by `make test` if missing.
DEBIAN_TEST_PACKAGES := strace faketime chromium:chromium chromium-driver:chromedriver tmux openssl

$(VENV)/.base: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.all: $(VENV)/.base
	$(PY) -m pip install -q -e '.[test,spark]'
	touch $@

install: $(VENV)/.base
install-all: $(VENV)/.all

system-deps:
	tools/debian-packages.sh $(DEBIAN_TEST_PACKAGES)

run: $(VENV)/.base
	$(VENV)/bin/equeue broker

test: $(VENV)/.all system-deps
	$(PY) -m ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.all
	$(PY) -m ruff check .

bench: $(VENV)/.all
	$(PY) -m bench.run_all

clean:
	rm -rf $(VENV) data build *.egg-info

.PHONY: cluster
cluster: $(VENV)/.base  # 2 name servers + 3 brokers, data under data/dev-cluster; Ctrl-C stops all (docs/cluster.md)
	$(VENV)/bin/equeue dev-cluster --data-dir data/dev-cluster

.PHONY: bank
bank: $(VENV)/.base  # the CQRS bank example end to end (examples/bank/README.md)
	$(PY) -m examples.bank
