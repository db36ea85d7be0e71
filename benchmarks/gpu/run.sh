#!/usr/bin/env bash
# `make benchmark-gpu` in one command, for a GPU machine with JAX and PyTorch but no TensorFlow
# and no network (wheels prepared beforehand with prepare_wheels.sh and carried along):
#   bash benchmarks/gpu/run.sh [bench_gpu.py options]       # e.g. --smoke, --resolutions 224
# 1. installs, offline, the wheels of requirements.txt that this Python lacks, into $KE_GPU_SITE
#    (pip --target, found through PYTHONPATH): the machine's own jax, torch and numpy stay in use.
#    (Not a venv: there python3 is itself a venv, and a venv made from it with
#    --system-site-packages would see the base interpreter's packages, not its jax and torch.)
# 2. makes this checkout importable (PYTHONPATH; nothing to build, none of the TensorFlow
#    requirements of setup.cfg pulled in);
# 3. runs benchmarks/bench_gpu.py under KERAS_BACKEND=jax.
# Environment: PYTHON (default python3), KE_GPU_WHEELS (default benchmarks/gpu/wheels),
# KE_GPU_SITE (default /tmp/ke-gpu-site).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
WHEELS=${KE_GPU_WHEELS:-benchmarks/gpu/wheels}
SITE=${KE_GPU_SITE:-/tmp/ke-gpu-site}
export KERAS_BACKEND=jax PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2

echo "python: $($PYTHON -c 'import sys; print(sys.executable, sys.version.split()[0])')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader || echo "nvidia-smi: not found"

# The requirements this Python lacks (Keras 2, tf-keras's, does not count as Keras), each with
# "optional" after it where requirements.txt lists it after its "optional" heading (the peer's).
missing=$($PYTHON - benchmarks/gpu/requirements.txt <<'PY'
import importlib.metadata as metadata, re, sys
optional = False
for line in open(sys.argv[1]):
    optional = optional or line.startswith("# The outside peer, optional")
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, version = line.split("==")
    try:
        present = metadata.version(name)
    except metadata.PackageNotFoundError:
        present = None
    if present is None or (name == "keras" and int(re.match(r"\d+", present)[0]) < 3):
        print(line, "optional" if optional else "required")
PY
)
required=$(echo "$missing" | awk '$2 == "required" {print $1}')
if [ -z "$required" ] && [ -n "$missing" ] && [ ! -d "$WHEELS" ]; then
    # Only the timm peer's packages are missing, and no wheels to install them from: the Keras
    # part runs, and the peer's part says why it is skipped (as it does wherever timm is absent).
    echo "no $WHEELS: the timm peer's packages stay missing ($(echo "$missing" | \
        awk '{print $1}' | xargs)); the run goes on without them"
    missing="" peer_missing=1
fi
missing=$(echo "$missing" | awk '{print $1}')
if [ -n "$missing" ]; then
    echo "installing offline from $WHEELS into $SITE: $(echo $missing)"
    if [ ! -d "$WHEELS" ]; then
        echo "error: $WHEELS is missing; run 'make benchmark-gpu-wheels' where PyPI is" \
             "reachable and bring the folder along" >&2
        exit 1
    fi
    $PYTHON -m pip install --quiet --disable-pip-version-check --no-index --no-deps \
        --no-compile --no-cache-dir --upgrade --target "$SITE" --find-links "$WHEELS" $missing
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
elif [ -z "${peer_missing:-}" ]; then
    echo "every requirement is installed already"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec $PYTHON -m benchmarks.bench_gpu "$@"
