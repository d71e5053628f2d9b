#!/usr/bin/env bash
# Llama-3.1-8B bf16 calibration on one GPU, sized to finish in ~8 minutes (for a later session
# that is lent a GPU; run from the repository root, e.g. through the device `run` tool).
#
#   bash calibrate/gpu_run.sh            # writes $OUT (or ./calib_out) /<gpu>-llama-3.1-8b-bf16.*:
#                                        #   .json (profile), .coefficients.json (the measured
#                                        #   step-time model refitted on this GPU), .md/.png report
#   FLEX=1 bash calibrate/gpu_run.sh     # also time FlexAttention paged decode (compiles per shape)
#   BUDGET=300 bash calibrate/gpu_run.sh
#
# Needs torch with CUDA, numpy, pandas, matplotlib, pydantic >= 2 and pyyaml importable. The borrowed
# machine had torch 2.11, pandas, matplotlib, typer, pytest; if pydantic or yaml are missing, carry
# wheels in shared/wheels/ (pip download pydantic pydantic-core annotated-types typing-inspection
# typing-extensions pyyaml rich) and this script installs them offline.
set -euo pipefail
OUT_DIR="${OUT:-./calib_out}"
BUDGET="${BUDGET:-420}"          # seconds for probe + checks + sweep; the wall limit is below
MODEL="${MODEL:-llama-3.1-8b}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT_DIR"

if ! "$PY" -c "import pydantic, yaml, rich" 2>/dev/null; then
  if [ -d shared/wheels ]; then
    "$PY" -m pip install --no-index --find-links shared/wheels pydantic pyyaml rich >/dev/null
  else
    echo "missing pydantic/pyyaml/rich and no shared/wheels to install from" >&2
    exit 2
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

"$PY" - <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
assert torch.cuda.is_available(), "no CUDA device"
print("device", torch.cuda.get_device_name(0))
PY

KERNELS=""
if [ "${FLEX:-0}" = "1" ]; then
  KERNELS="--decode-kernels torch-gather-sdpa,flex-paged"
fi
GPU_NAME=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0).split()[-1].lower())")
STEM="$OUT_DIR/${GPU_NAME}-${MODEL}-bf16"

# The kernel checks (float64 reference) run first; a failing kernel aborts before timing.
timeout $((BUDGET + 120)) "$PY" -m calibrate.cli --model "$MODEL" --dtype bfloat16 \
  --device cuda --budget "$BUDGET" --out "$STEM.json" --report-dir "$OUT_DIR" $KERNELS \
  2>&1 | tee "$OUT_DIR/calibrate.log"
# calibrate.cli also wrote the measured model's coefficients (gemm, decode and prefill attention
# fitted here; elementwise, all-reduce, engine overhead carried over from the shipped fit) and
# printed the decode kernel's fraction of HBM bandwidth.
test -s "$STEM.coefficients.json" || { echo "no $STEM.coefficients.json written" >&2; exit 1; }
ls -la "$OUT_DIR"
