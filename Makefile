# keras-efficientnet: set-up, tests, training and benchmarks. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
JAX_VENV := .venv-jax
PY := $(VENV)/bin/python
export TF_CPP_MIN_LOG_LEVEL ?= 2
# XLA is slower on CPU for these models; Keras' `jit_compile="auto"` is overridden in code too.
export PYTHONUNBUFFERED := 1

.PHONY: help install install-jax install-horovod venv-timm test test-tf test-jax test-slow train lint \
        benchmark benchmark-quick benchmark-smoke benchmark-deps benchmark-layers \
        benchmark-pipeline benchmark-distribute benchmark-first-hour benchmark-deploy \
        install-deploy-peer benchmark-pareto \
        benchmark-microbatch data-fashion benchmark-fashion benchmark-fashion-time \
        benchmark-fashion-microbatch benchmark-fashion-protocol benchmark-figure1 \
        benchmark-gpu benchmark-gpu-wheels benchmark-gpu-smoke clean

help:
	@echo "make train       set up and run the default job (flags/default.flags) on digits"
	@echo "make test        TensorFlow tests (2 workers) beside the portable tests under JAX without TF"
	@echo "make test-slow   also the slow tests (every preset, ...)"
	@echo "make benchmark   CPU benchmarks (layers, models, host pipeline, plans, command latency,"
	@echo "                 deployed runtimes; 68 min on this project's 2-core AMD EPYC, timm included):"
	@echo "                 prints its expected duration first, resumes where a stopped"
	@echo "                 run stopped (FORCE=1 measures again); JSON rows and PNG charts in"
	@echo "                 benchmarks/results/"
	@echo "make benchmark-quick  the same with fewer rounds and sizes (576 CPU seconds on 2 cores:"
	@echo "                      under 10 min quiet): rows marked quick, results/<name>_quick.jsonl"
	@echo "make benchmark-smoke  every benchmark module for a few steps at tiny sizes (rows in a"
	@echo "                      temporary folder): checks that each still runs"
	@echo "make benchmark-layers / -pipeline / -distribute / -first-hour   one part of make benchmark"
	@echo "make venv-timm   .venv-timm: torch + timm, the benchmarks' PyTorch peer"
	@echo "make benchmark-deploy      our exports and timm's efficientnet_b0 on ONNX Runtime and"
	@echo "                           OpenVINO (+ TensorFlow, PyTorch eager): images/s, latency"
	@echo "make benchmark-pareto      top-1 against training time on digits (~4 min)"
	@echo "make benchmark-microbatch  top-1 of BN, GN, LN, LN+PN at micro-batch 2/8/32 (2 seeds)"
	@echo "make benchmark-gpu-wheels  download the wheels benchmark-gpu needs offline"
	@echo "make benchmark-gpu         GPU benchmark under JAX (+ timm peer), no TensorFlow"
	@echo "make benchmark-gpu-smoke   the same path on this CPU at tiny sizes (.venv-jax)"
	@echo "make data-fashion  install Fashion-MNIST (Debian's package; as root, else prints how)"
	@echo "make benchmark-fashion-time        Fashion-MNIST test top-1 (95% t) against training"
	@echo "                                   seconds, 3 recipes x 3 seeds (at most 60 min)"
	@echo "make benchmark-fashion-microbatch  BN/GN/LN/LN+PN at micro-batch 2 and 32, 3 epochs"
	@echo "                                   (~2.2 CPU h a seed; stops at 60 min, resumes)"
	@echo "make benchmark-fashion             both; a stopped one resumes when run again"
	@echo "make benchmark-fashion-protocol    every recipe's full schedule, 3 seeds (hours;"
	@echo "                                   EXPERIMENT=native40|table96, resumes)"
	@echo "make benchmark-figure1             the paper's Figure 1 for this machine's hours"
	@echo "make lint        ruff (style, import order, stale noqa); CI runs it before the tests"

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ".[cpu,digits,test,deploy]"
	touch $@

# A second environment with Keras and JAX but *no TensorFlow*: it proves that the model,
# layers and optimizers import and train without it (as on a GPU machine with only JAX).
$(JAX_VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(JAX_VENV)
	$(JAX_VENV)/bin/pip install -q --upgrade pip
	$(JAX_VENV)/bin/pip install -q "keras>=3.10,<4" "jax[cpu]" numpy scipy absl-py pytest
	$(JAX_VENV)/bin/pip install -q --no-deps -e .
	touch $@

install: $(VENV)/.installed
install-jax: $(JAX_VENV)/.installed

# The two parts side by side: the JAX part (Keras on JAX without TensorFlow, mostly XLA
# compiles) takes the second core while the TensorFlow part traces and starts processes on one.
# Its output, in a temporary file, follows the TensorFlow part's; either part failing fails.
test: install install-jax
	@log=$$(mktemp); \
	$(MAKE) --no-print-directory test-jax JAX_PYTEST_OPTS="-p no:cacheprovider" >$$log 2>&1 & \
	jax=$$!; \
	$(MAKE) --no-print-directory test-tf; tf=$$?; \
	wait $$jax; jaxrc=$$?; \
	echo "==== JAX part (KERAS_BACKEND=jax, no TensorFlow), run beside the TensorFlow part ===="; \
	cat $$log; rm -f $$log; \
	echo "make test: TensorFlow part exit $$tf, JAX part exit $$jaxrc"; \
	[ $$tf -eq 0 ] && [ $$jaxrc -eq 0 ]

# oneDNN off for the whole TensorFlow suite, as TensorFlow leaves it on AVX2-only x86 CPUs: a
# machine whose CPU turns it on cannot hide a kernel that only oneDNN has. Both settings are
# tested side by side in tests/layers/test_group_conv_onednn.py.
# Two pytest-xdist workers, a test file at a time (module fixtures are built once): one pytest
# process leaves a core idle while it traces graphs and waits on subprocesses. TEST_WORKERS=0
# runs the suite in one process.
TEST_WORKERS ?= 2
test-tf: install
	TF_ENABLE_ONEDNN_OPTS=0 $(VENV)/bin/pytest -m "not slow" --durations=10 \
	    $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) tests

# XLA's compile is most of the JAX suite's time on a CPU and the tests' models are tiny: its
# slower optimisation passes off (as benchmark-gpu's CPU smoke run does) took the three
# longest tests from 116 to 75 CPU seconds here; its older CPU emitters then took the whole
# JAX part from 77 to 52 CPU seconds (the same 199 tests pass).
JAX_TEST_XLA_FLAGS := --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true \
                      --xla_cpu_use_fusion_emitters=false
test-jax: install-jax
	XLA_FLAGS="$(JAX_TEST_XLA_FLAGS)" KERAS_BACKEND=jax KE_EXPECT_NO_TENSORFLOW=1 \
	    $(JAX_VENV)/bin/pytest \
	    -m "not slow and not tf_only and not jax_cpu_slow" --durations=10 $(JAX_PYTEST_OPTS) \
	    tests/layers tests/models tests/optimizers

# With horovod built (install-horovod), this includes its 2-process runs under horovodrun
# (tests/distribute/test_distribute_horovod.py); without it they are skipped and -rs says why.
test-slow: install install-jax
	TF_ENABLE_ONEDNN_OPTS=0 $(VENV)/bin/pytest -rs --durations=20 tests
	XLA_FLAGS="$(JAX_TEST_XLA_FLAGS)" KERAS_BACKEND=jax KE_EXPECT_NO_TENSORFLOW=1 \
	    $(JAX_VENV)/bin/pytest -m "not tf_only" \
	    tests/layers tests/models tests/optimizers

train: install
	$(PY) -m keras_efficientnet.train --flagfile=flags/default.flags

# Fashion-MNIST for --dataset=fashion_mnist (data/README.md): Debian's package puts the four
# idx files in FASHION_MNIST_DIR; the source checks their MD5s when it reads them.
FASHION_MNIST_DIR := /usr/share/datasets/fashion-mnist
data-fashion:
	@if [ -f $(FASHION_MNIST_DIR)/t10k-labels-idx1-ubyte.gz ]; then \
	    echo "Fashion-MNIST is installed in $(FASHION_MNIST_DIR)"; \
	elif [ "$$(id -u)" = 0 ]; then \
	    apt-get install -y dataset-fashion-mnist || \
	        { apt-get update && apt-get install -y dataset-fashion-mnist; }; \
	else \
	    echo "Fashion-MNIST is not installed; as root, run:"; \
	    echo "  sudo apt-get install -y dataset-fashion-mnist"; \
	    exit 1; \
	fi

# ruff with import order (I) and stale `noqa` detection (RUF100): pyproject.toml.
lint: install
	$(VENV)/bin/ruff check keras_efficientnet tests benchmarks data flags scripts examples setup.py

# Optional: horovod 0.28.1 built against TF 2.21 with Gloo (12 min 16 s on 2 shared cores).
install-horovod: install
	scripts/install_horovod.sh $(VENV)

# The PyTorch peer of benchmark-layers (timm's B0s) in its own environment, never in the
# project's dependencies: torch + torchvision pinned so that they load together on this CPU.
TIMM_VENV := .venv-timm
$(TIMM_VENV)/.installed: scripts/venv_timm.sh
	scripts/venv_timm.sh $(TIMM_VENV)
venv-timm: $(TIMM_VENV)/.installed

# Benchmarks (benchmarks/README.md): each writes results/<name>.jsonl and <name>.png, through
# benchmarks/targets.py, which holds what each target runs. It prints the expected duration (the
# wall times results/wall_times.json recorded here), skips a module whose rows are current (same
# code, configuration and CPU; FORCE=1 measures again) and records each module's wall time.
# QUICK=1 (make benchmark-quick): fewer rounds, rows in results/<name>_quick.jsonl. Options for
# every module of a target go in ARGS (they become part of the resume key).
BENCH = $(PY) -m benchmarks.targets run $(if $(FORCE),--force) $(if $(QUICK),--quick)

# A failed venv-timm does not stop benchmark-layers: its rows then say why timm is missing.
benchmark-deps: install
	-$(MAKE) --no-print-directory venv-timm
	$(PY) -c "import skimage" 2>/dev/null || $(VENV)/bin/pip install -q -e ".[bench]"

benchmark-layers: benchmark-deps
	$(BENCH) benchmark-layers -- $(ARGS)

benchmark-pipeline: benchmark-deps
	$(BENCH) benchmark-pipeline -- $(ARGS)

benchmark-distribute: install
	$(BENCH) benchmark-distribute -- $(ARGS)

# How soon the commands answer: first line, errors, exit, predict (bench_first_hour.py).
benchmark-first-hour: install
	$(BENCH) benchmark-first-hour -- $(ARGS)

# The deployment benchmark's peer in the dev venv (its runtimes come with `install`'s deploy
# extra), never in the project's dependencies: a CPU build of torch (this machine's disk holds
# torch 2.13.0+cpu; elsewhere give TORCH_SPEC and, e.g., PIP_TORCH_OPTIONS="--index-url <PyTorch's
# CPU wheel index>") and timm. Installs only what is missing; numpy, TensorFlow and protobuf stay.
TORCH_SPEC ?= torch==2.13.0+cpu
TIMM_SPEC ?= timm==1.0.31
install-deploy-peer: install
	$(PY) -c "import torch, importlib.util as u; assert u.find_spec('timm')" 2>/dev/null || \
	    $(VENV)/bin/pip install -q $(PIP_TORCH_OPTIONS) "$(TORCH_SPEC)" "$(TIMM_SPEC)"

benchmark-deploy: install-deploy-peer
	$(BENCH) benchmark-deploy -- $(ARGS)

# One run of the five, so that the expected duration printed first covers them all.
benchmark: benchmark-deps install-deploy-peer
	$(BENCH) benchmark-layers benchmark-pipeline benchmark-distribute benchmark-first-hour \
	  benchmark-deploy -- $(ARGS)

benchmark-quick:
	$(MAKE) --no-print-directory benchmark QUICK=1

# Every module of every benchmark target with --smoke, 2 side by side (tests/benchmarks/
# test_benchmark_smoke.py runs the same in make test); the GPU one under .venv-jax if present.
benchmark-smoke: install
	$(PY) -m benchmarks.targets smoke

benchmark-pareto: install
	$(BENCH) benchmark-pareto -- $(ARGS)

# Options for bench_microbatch.py go in ARGS, e.g. ARGS="--seeds 0" (about half the time).
benchmark-microbatch: install
	$(BENCH) benchmark-microbatch -- $(ARGS)

# Fashion-MNIST (benchmarks/README.md): each target stops after 60 minutes; its rows are kept and
# the next run skips them. Options in ARGS, e.g. ARGS="--seeds 0 1 2 3 4" or ARGS=--report-only.
FASHION_BUDGET := 3600
benchmark-fashion: benchmark-fashion-time benchmark-fashion-microbatch

benchmark-fashion-time: install
	timeout $(FASHION_BUDGET) $(PY) -m benchmarks.bench_fashion time $(if $(QUICK),--quick) \
	  $(ARGS) || { \
	  echo "benchmark-fashion-time stopped: run it again to resume"; exit 1; }

benchmark-fashion-microbatch: install
	timeout $(FASHION_BUDGET) $(PY) -m benchmarks.bench_fashion microbatch $(if $(QUICK),--quick) \
	  $(ARGS) || { \
	  echo "benchmark-fashion-microbatch stopped: run it again to resume"; exit 1; }

# The paper's protocol on Fashion-MNIST (benchmarks/README.md): each recipe's full schedule as
# the training command, 3 seeds; hours on 2 cores, resumed where it stopped when run again.
# EXPERIMENT=native40 (every family at 40 px) or table96 (test 96 px, reduced 64 px);
# ARGS=--quick checks the whole path in minutes.
EXPERIMENT ?= table96
benchmark-fashion-protocol: install data-fashion
	$(PY) -m benchmarks.bench_fashion_protocol $(EXPERIMENT) $(ARGS)

# The paper's Figure 1 for this machine: B0-B3 recipes' step rates here x their epochs, against
# the paper's top-1 (read off its Figure 1). ARGS=--quick: B0 only, in minutes.
benchmark-figure1: install
	$(PY) -m benchmarks.bench_figure1 $(ARGS)

# Run where PyPI is reachable; carry benchmarks/gpu/wheels to the GPU machine.
benchmark-gpu-wheels:
	bash benchmarks/gpu/prepare_wheels.sh

# On a GPU machine with JAX (and PyTorch + timm for the peer) but no TensorFlow: no venv of
# ours, no network. Options for bench_gpu.py go in ARGS, e.g. ARGS="--resolutions 224".
benchmark-gpu:
	bash benchmarks/gpu/run.sh $(ARGS)

benchmark-gpu-smoke: install-jax
	PYTHON=$(JAX_VENV)/bin/python bash benchmarks/gpu/run.sh --smoke $(ARGS)

clean:
	rm -rf $(VENV) $(JAX_VENV) *.egg-info .pytest_cache
