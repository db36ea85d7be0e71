#!/usr/bin/env bash
# Builds horovod 0.28.1 for TensorFlow 2.21 (Gloo, no MPI) into a virtualenv (default .venv).
#
# Horovod 0.28.1 predates TF 2.21: its XLA custom-call op (horovod/tensorflow/xla_mpi_ops.cc)
# no longer compiles, so it is dropped from the CMake source list; nothing in this project uses
# horovod's XLA path (jit_compile stays off). Needs cmake, a C++17 compiler and TF's headers.
# Usage: scripts/install_horovod.sh [VENV]   (then: horovodrun -np 2 python -m ...)
set -euo pipefail

VENV="${1:-.venv}"
VERSION=0.28.1
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "no virtualenv at $VENV: run 'make install' first" >&2; exit 1; }
command -v cmake >/dev/null || "$PY" -m pip install -q cmake

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip download -q --no-deps --no-binary=:all: "horovod==$VERSION" -d "$WORK"
tar -xzf "$WORK/horovod-$VERSION.tar.gz" -C "$WORK"
SRC="$WORK/horovod-$VERSION"
CMAKE_LIST="$SRC/horovod/tensorflow/CMakeLists.txt"
grep -q "xla_mpi_ops.cc" "$CMAKE_LIST" || {
    echo "xla_mpi_ops.cc not found in $CMAKE_LIST: the sdist changed, check the patch" >&2
    exit 1
}
# Remove the XLA op's line from the source list (the only change to horovod's sources).
sed -i '/xla_mpi_ops\.cc/d' "$CMAKE_LIST"

# Gloo instead of MPI: no system MPI needed, and horovodrun launches Gloo jobs itself.
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO
export MAKEFLAGS="-j$(nproc)"
"$PY" -m pip install -q --no-build-isolation --no-cache-dir "$SRC"
"$PY" - <<'PY'
import horovod
import horovod.tensorflow as hvd

hvd.init()
print(f"horovod {horovod.__version__} built: gloo={hvd.gloo_built()} mpi={hvd.mpi_built()} "
      f"size={hvd.size()}")
PY
