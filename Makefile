# The two commands: `make run` and `make test`. Each creates .venv and installs on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: run test install install-all system-deps bytecode lint bench bench-deps bench-peers clean

# Debian packages the suite drives (package or package:command); installed by `make test` if missing.
DEBIAN_TEST_PACKAGES := strace faketime chromium:chromium chromium-driver:chromedriver tmux openssl
# Peer brokers the benchmark starts itself (bench/peers/); installed by `make bench` only, not by `make test`.
DEBIAN_BENCH_PACKAGES := redis-server nats-server rabbitmq-server

$(VENV)/.base: pyproject.toml setup.py equeue_core/_native.c  # pip install -e . also builds the C hot path
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.all: $(VENV)/.base
	$(PY) -m pip install -q -e '.[test,spark]'
	touch $@

install: $(VENV)/.base
install-all: $(VENV)/.all

# Our own modules, compiled to __pycache__ before the broker or the suite starts. pip compiles
# what it installs into site-packages, but not an editable install's sources, and an environment
# with PYTHONDONTWRITEBYTECODE=1 (this project's machines have it) never caches them either: then
# every broker, CLI and test subprocess compiled its modules of ours (~140 in a broker) from
# source again, 0.15-0.2 s of each start (a broker's start to "listening": 0.45 s, 0.27 s with
# the cache). Python still reads a cache it may not write, and compileall skips what is up to
# date, so this costs ~0.5 s once.
PY_SOURCES := equeue_core plugins spark cqrs bench tests examples pyspark_equeue.py
bytecode: $(VENV)/.base
	$(PY) -m compileall -q -j 0 $(PY_SOURCES)

system-deps:
	tools/debian-packages.sh $(DEBIAN_TEST_PACKAGES)

run: $(VENV)/.base bytecode
	$(VENV)/bin/equeue broker

test: $(VENV)/.all system-deps bytecode
	$(PY) -m ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.all
	$(PY) -m ruff check .

$(VENV)/.bench: $(VENV)/.all
	$(PY) -m pip install -q -e '.[test,spark,bench]'
	touch $@

bench-deps: $(VENV)/.bench  # peer servers (Debian) and their Python clients (the `bench` extra)
	tools/debian-packages.sh $(DEBIAN_BENCH_PACKAGES)

bench: bench-deps bytecode
	$(PY) -m bench.run_all

bench-peers: bench-deps bytecode  # only the peers benchmark (bench/peers/); BENCH_ARGS=--quick for a ~1-minute run
	$(PY) -m bench.peers $(BENCH_ARGS)

clean:
	rm -rf $(VENV) data build *.egg-info equeue_core/_native*.so

.PHONY: cluster
cluster: $(VENV)/.base  # 2 name servers + 3 brokers, data under data/dev-cluster; Ctrl-C stops all (docs/cluster.md)
	$(VENV)/bin/equeue dev-cluster --data-dir data/dev-cluster

.PHONY: bank
bank: $(VENV)/.base  # the CQRS bank example end to end (examples/bank/README.md)
	$(PY) -m examples.bank
