# The two commands of the README. Each sets itself up on first use and is idempotent.
#   make ablation   quick attention-dimensionality ablation (CPU, 2 cores: 80 min measured for 3500 steps, 030e0f9)
#   make ablation-transformer   the Transformer's d_k ablation (CPU, 2 cores; resumable)
#   make test       the default test suite (fresh clone: 263 s of pytest on the idle 2-core Xeon at 3ae9899, 465 s on an idle 2-core AMD EPYC at 50bae2c; the aim is under 10 minutes on either)
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

# The stamp says only that the lock was installed once: a venv damaged since
# (a locked distribution missing, of another version, or with files gone, as
# when site-packages/optax is deleted) is found by scripts/check_venv.py
# (half a second), run on every call, and its failure makes the stamp's rule
# run, which reinstalls what it names. A venv without a lock (LOCK=none) is
# not checked.
ifneq ($(wildcard $(PY)),)
ifneq ($(shell $(PY) scripts/check_venv.py >/dev/null 2>&1; echo $$?),0)
.PHONY: $(STAMP)
endif
endif

# Rewrites the lock files from pyproject.toml, keeping the versions already
# locked; LOCK_ARGS="--upgrade-package jax" (or "--upgrade") moves them.
lock:
	PYTHON_SYS="$(PYTHON_SYS)" bash scripts/lock.sh $(LOCK_ARGS)

# SWORD Bible modules (Debian packages, unpacked without root into the cache).
sword:
	bash scripts/fetch_sword.sh

# The corpora and the 2,000-piece tokenizer every README preset uses (the
# prepare_data default, 8,000, is the britz_wmt preset's).
data: $(STAMP) sword
	$(PY) -m experiments.prepare_data --vocab_size=2000

# The quick preset's corpus and 2k-piece tokenizer (the driver would prepare them too).
ablation: $(STAMP) sword
	$(PY) -m experiments.prepare_data --vocab_size=2000
	$(PY) -m experiments.ablation --preset=quick --workdir=$(WORKDIR)

# The Transformer's d_k ablation (preset `transformer`, the same data as `ablation`).
ablation-transformer: $(STAMP) sword
	$(PY) -m experiments.prepare_data --vocab_size=2000
	$(PY) -m experiments.ablation --preset=transformer --workdir=$(TWORKDIR)

# An accelerator of one's own (docs/gpu_tpu.md). `make venv-cuda` (an NVIDIA GPU: jax's
# CUDA 13 plugin with NVIDIA's CUDA and cuDNN wheels, driver 580 or newer) or `make
# venv-tpu` (a Cloud TPU VM: libtpu) installs $(VENV) from that target's lock for its
# Python (3.11 or 3.12: PYTHON_SYS) and the corpus's SWORD modules; `make` afterwards
# keeps, and repairs, the lock the venv was built from. `make ablation-gpu` runs the
# gpu preset in one go (no 7-minute pieces), its steps from a calibration where
# CALIBRATION names its calibration.json, and refuses a venv whose JAX sees no GPU or TPU.
GWORKDIR    ?= runs/gpu
# More flags for ablation-gpu, e.g. GFLAGS=--workers=8 (a GPU or a TPU chip per worker).
GFLAGS      ?=
CALIBRATION ?=
.PHONY: venv-cuda venv-tpu ablation-gpu
venv-cuda: sword
	bash scripts/bootstrap.sh "$(PYTHON_SYS)" "$(VENV)" "$(LOCK)" cuda
	touch $(STAMP)

venv-tpu: sword
	bash scripts/bootstrap.sh "$(PYTHON_SYS)" "$(VENV)" "$(LOCK)" tpu
	touch $(STAMP)

ablation-gpu: $(STAMP) sword
	@$(PY) -c 'import jax, sys; b = jax.default_backend(); sys.exit(0 if b in ("gpu", "tpu") \
	  else f"error: JAX sees no GPU or TPU (backend {b}): make venv-cuda or make venv-tpu")'
	$(PY) -m experiments.ablation --preset=gpu --max_minutes=0 --workdir=$(GWORKDIR) \
	  $(if $(CALIBRATION),--calibration=$(CALIBRATION)) $(GFLAGS)

demo: $(STAMP)
	$(PY) -m experiments.demo

test: $(STAMP) sword
	$(PY) -m pytest -q -n 2 --dist=loadfile tests

test-all: $(STAMP) sword
	$(PY) -m pytest -q -n 2 --dist=loadfile -m "" tests

# The launcher on a real scheduler: a one-node SLURM on this machine (root and
# Debian's slurm-wlm and munge, installed by scripts/slurm_local.sh; docs/cluster.md),
# a 2-task array and its report against one driver, then a preempted task's requeue.
# `make test-all` runs it too; it skips with its reason where there is no root or apt.
.PHONY: test-slurm
test-slurm: $(STAMP) sword
	$(PY) -m pytest -q -m slow tests/experiments/test_launch.py -k slurm

clean-venv:
	rm -rf $(VENV)

# Compile for an H100 and a TPU v5e without either (a separate Python 3.12
# environment, .venv-aot: jax 0.11.2, libtpu, the CUDA 13 plugin, cuDNN);
# tables in $(OUT), by default runs/compile_check (ignored by git): a run cut
# part-way must not replace the committed tables of results/compile_check,
# which are written only when named, `make compile-check OUT=results/compile_check`.
# On the 2-core machine (338dae5 / 94ec96d): the H100 run 4 min 41 s alone, the
# TPU run 10 min (fewer kernel and additive lengths).
AOT_VENV ?= .venv-aot
# Set, not `?=`: only the command line names it, never an OUT left in the
# environment (some machines export one for their own outputs).
OUT      := runs/compile_check
.PHONY: compile-check compile-check-test
$(AOT_VENV)/.installed-stamp: scripts/aot_env.sh pyproject.toml
	bash scripts/aot_env.sh "$(PYTHON312)" "$(AOT_VENV)"
	touch $@
PYTHON312 ?= python3.12

compile-check: $(AOT_VENV)/.installed-stamp
	$(AOT_VENV)/bin/python -m experiments.compile_check.run --target=h100 --out=$(OUT)
	$(AOT_VENV)/bin/python -m experiments.compile_check.run --target=tpu_v5e \
	    --kernel_seq_lens=512,2048,8192,16384 --additive_seq_lens=256,1024,4096 \
	    --out=$(OUT)

compile-check-test: $(AOT_VENV)/.installed-stamp $(STAMP)
	$(PY) -m pytest -q -m aot tests/compile_check/test_compile_check.py
