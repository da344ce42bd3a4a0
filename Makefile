# The two commands of the README. Each sets itself up on first use and is idempotent.
#   make ablation   quick attention-dimensionality ablation (CPU, 2 cores: about 2.3 hours; 138 min measured for 3500 steps, fa7146e)
#   make ablation-transformer   the Transformer's d_k ablation (CPU, 2 cores; resumable)
#   make test       the test suite (under 10 minutes on 2 CPU cores)
# The venv is built from the lock file of its Python (requirements/, exact
# versions with hashes; LOCK=none for an unpinned install); `make lock`
# regenerates the lock files (docs/reproducibility.md).
PYTHON_SYS ?= python3
VENV       ?= .venv
LOCK       ?=
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.installed-stamp
WORKDIR    ?= runs/quick
TWORKDIR   ?= runs/transformer

.PHONY: ablation ablation-transformer test test-all data sword demo clean-venv lock

$(STAMP): pyproject.toml $(wildcard requirements/*.lock.txt)
	bash scripts/bootstrap.sh "$(PYTHON_SYS)" "$(VENV)" "$(LOCK)"
	touch $(STAMP)

# Rewrites the lock files from pyproject.toml, keeping the versions already
# locked; LOCK_ARGS="--upgrade-package jax" (or "--upgrade") moves them.
lock:
	PYTHON_SYS="$(PYTHON_SYS)" bash scripts/lock.sh $(LOCK_ARGS)

# SWORD Bible modules (Debian packages, unpacked without root into the cache).
sword:
	bash scripts/fetch_sword.sh

data: $(STAMP) sword
	$(PY) -m experiments.prepare_data

# The quick preset's corpus and 2k-piece tokenizer (the driver would prepare them too).
ablation: $(STAMP) sword
	$(PY) -m experiments.prepare_data --vocab_size=2000
	$(PY) -m experiments.ablation --preset=quick --workdir=$(WORKDIR)

# The Transformer's d_k ablation (preset `transformer`, the same data as `ablation`).
ablation-transformer: $(STAMP) sword
	$(PY) -m experiments.prepare_data --vocab_size=2000
	$(PY) -m experiments.ablation --preset=transformer --workdir=$(TWORKDIR)

demo: $(STAMP)
	$(PY) -m experiments.demo

test: $(STAMP) sword
	$(PY) -m pytest -q -n 2 --dist=loadfile tests

test-all: $(STAMP) sword
	$(PY) -m pytest -q -n 2 --dist=loadfile -m "" tests

clean-venv:
	rm -rf $(VENV)
