#!/usr/bin/env bash
# Downloads the wheels of benchmarks/gpu/requirements.txt for a GPU machine without network
# (run here, where PyPI is reachable): binary wheels only, no dependencies resolved (the list
# names every one), for each Python version in $GPU_PYTHON_VERSIONS (default: 3.12, the GPU
# image's, and this machine's, so that the offline install can be checked here too).
#   bash benchmarks/gpu/prepare_wheels.sh [DEST]     # = make benchmark-gpu-wheels
# DEST defaults to benchmarks/gpu/wheels (git-ignored; carry it to the GPU machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-benchmarks/gpu/wheels}
PYTHON=${PYTHON:-python3}
REQUIREMENTS=benchmarks/gpu/requirements.txt
LOCAL=$($PYTHON -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
VERSIONS=${GPU_PYTHON_VERSIONS:-"3.12 $LOCAL"}
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64
           manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)

mkdir -p "$DEST"
echo "wheels for Python $(echo $VERSIONS | tr ' ' '\n' | sort -u | tr '\n' ' ')into $DEST:"
grep -v '^\s*#' "$REQUIREMENTS" | grep -v '^\s*$' | sed 's/^/  /'
for version in $(echo $VERSIONS | tr ' ' '\n' | sort -u); do
    $PYTHON -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version "$version" --implementation cp \
        "${PLATFORMS[@]/#/--platform=}" -d "$DEST" -r "$REQUIREMENTS"
done
size=$(du -sm "$DEST" | cut -f1)
echo "$(ls "$DEST"/*.whl | wc -l) wheels, ${size} MiB in $DEST"
if [ "$size" -ge 60 ]; then
    echo "error: $DEST is ${size} MiB; a device call carries at most 64 MiB in all" >&2
    exit 1
fi
