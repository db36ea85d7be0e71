#!/usr/bin/env bash
# The PyPI peer's environment for the CPU benchmarks (make venv-timm): PyTorch, torchvision and
# timm in their own virtualenv (default .venv-timm), never in the project's dependencies.
#
# timm imports torchvision at `import timm` (timm.layers needs torchvision.ops). On these
# machines pip finds a CPU build of torch 2.13.0 on disk, but PyPI's torchvision for it is a CUDA
# build whose compiled extension needs libtorch_cuda and fails to import beside the CPU torch
# ("operator torchvision::nms does not exist"). torch 2.14.1 with torchvision 0.29.1, both on
# this disk for Python 3.11, load together (a CUDA build that runs on the CPU here), so the peer
# pins those. Override with TORCH_SPEC, e.g. TORCH_SPEC="torch==2.9.1 torchvision==0.24.1" on
# aarch64. The benchmarks read the versions from the child process and print them with the rows.
# Usage: scripts/venv_timm.sh [VENV]
set -euo pipefail

VENV="${1:-.venv-timm}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.14.1 torchvision==0.29.1}"
TIMM_SPEC="${TIMM_SPEC:-timm==1.0.31}"

"$PYTHON" -m venv "$VENV"
# shellcheck disable=SC2086  # the specs are word lists on purpose
"$VENV/bin/pip" install -q $TORCH_SPEC
"$VENV/bin/pip" install -q $TIMM_SPEC numpy
"$VENV/bin/python" - <<'PY'
import timm
import torch

model = timm.create_model("efficientnet_b0", pretrained=False, num_classes=10).eval()
out = model(torch.zeros(1, 3, 32, 32))
assert out.shape == (1, 10), out.shape
print(f"timm {timm.__version__} on torch {torch.__version__}: efficientnet_b0 builds and runs")
PY
touch "$VENV/.installed"
