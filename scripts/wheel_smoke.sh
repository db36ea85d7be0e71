#!/usr/bin/env bash
# The wheel as a new user gets it: builds it from this checkout, installs it with its
# [cpu,digits] extras into a fresh virtualenv, and from an empty directory (no flags/, no data/)
# trains the smoke recipe, then predicts one image with the model it wrote. Called by .ci/run
# after `make test`; every step is bounded. Usage: scripts/wheel_smoke.sh  (PYTHON=python3.11)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/wheel-smoke.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
step() { echo "== wheel smoke: $* ($(date -u +%H:%M:%S))"; }

step "build the wheel"
timeout 600 "$PYTHON" -m pip wheel -q --no-deps -w "$WORK/dist" "$REPO"
WHEEL="$(ls "$WORK"/dist/keras_efficientnet-*.whl)"
"$PYTHON" - "$WHEEL" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
needed = ["keras_efficientnet/flagfiles/smoke.flags", "keras_efficientnet/flagfiles/default.flags",
          "keras_efficientnet/models/imagenet_classes.tsv"]
missing = [name for name in needed if name not in names]
if missing:
    sys.exit(f"the wheel lacks {', '.join(missing)}")
PY

step "install it with [cpu,digits] into a fresh virtualenv"
"$PYTHON" -m venv "$WORK/venv"
timeout 1200 "$WORK/venv/bin/pip" install -q "$WHEEL[cpu,digits]"

mkdir "$WORK/empty"
cd "$WORK/empty"
export KERAS_EFFICIENTNET_DATA_DIR="$WORK/data"  # the digits are written here, not in a cache
step "train the smoke recipe from an empty directory"
timeout 900 "$WORK/venv/bin/keras-efficientnet-train" --recipe=smoke --model_dir="$WORK/run" \
    | tee "$WORK/train.log"
grep -q "top-1" "$WORK/train.log"
test -f "$WORK/run/model.keras"

step "predict one image"
"$WORK/venv/bin/python" -c "
import numpy as np, PIL.Image
PIL.Image.fromarray(np.full((48, 40, 3), 200, np.uint8)).save('$WORK/one.png')"
timeout 300 "$WORK/venv/bin/keras-efficientnet-predict" --model_file="$WORK/run/model.keras" \
    "$WORK/one.png" --output="$WORK/one.csv"
test "$(wc -l < "$WORK/one.csv")" -eq 2
head -2 "$WORK/one.csv"

step "export the run as a SavedModel"
timeout 300 "$WORK/venv/bin/keras-efficientnet-export" "$WORK/run" --output="$WORK/saved_model"
test -f "$WORK/saved_model/saved_model.pb"
step "ok"
