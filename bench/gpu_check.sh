#!/usr/bin/env bash
# One prepared check of the vLLM rollout engine on a lent GPU machine, run as ONE call from the repository root:
#
#     bash bench/gpu_check.sh            # results in $OUT (default ./gpu_check_out)
#
# Steps, each under `timeout $STEP_TIMEOUT` (480 s) and all under $TOTAL_BUDGET (570 s, so the call fits the
# device's 10-minute command limit; a step gets what is left, and a step with < 20 s left is skipped):
#   1. python: $GPU_PYTHON, else ./.venv-gpu, else the machine's python3, whichever imports torch with CUDA,
#      vllm and tandem; otherwise create .venv-gpu (--system-site-packages, reusing the image's packages)
#      and pip install vllm (the CUDA build, which brings its own torch) and the repo (-e ".[dev]").
#      Without a package registry this install fails; later steps then run with what imports and say so.
#   2. the engine contract test (tests/unit/rollout/test_engine_contract.py): vLLM on CUDA.
#   3. a colocated and a decoupled GRPO run of configs/quickstart.yaml with rollout.backend=vllm, 20 steps,
#      then the median timing/* and weight-sync metrics of each (metrics.jsonl).
#   4. bench/engines.py --quick on the 100m and 400m models (hf / vllm / trl generate tokens/s on CUDA).
# A dry run of the script's plumbing on a CPU machine (no install, small models):
#     GPU_PYTHON=.venv/bin/python GPU_CHECK_ALLOW_CPU=1 STEPS=2 ENGINE_SIZES=1m bash bench/gpu_check.sh
# $OUT holds at most 8 files (the device returns no more): summary.txt (everything that matters) and one
# log per step; the run folders stay in $WORK (outside $OUT: too many files to bring back).
set -uo pipefail

OUT=${OUT:-$PWD/gpu_check_out}
WORK=${WORK:-/tmp/tandem_gpu_check}
STEP_TIMEOUT=${STEP_TIMEOUT:-480}
TOTAL_BUDGET=${TOTAL_BUDGET:-570}
VENV=${GPU_VENV:-.venv-gpu}
STEPS=${STEPS:-20}
mkdir -p "$OUT" "$WORK"
SUMMARY="$OUT/summary.txt"
START=$SECONDS
: >"$SUMMARY"

log() { echo "[$(date +%T) +$((SECONDS - START))s] $*" | tee -a "$SUMMARY"; }

# step NAME CMD...: run CMD with stdout+stderr in $OUT/NAME.log under min(STEP_TIMEOUT, what is left).
step() {
  local name=$1 left rc
  shift
  left=$((TOTAL_BUDGET - (SECONDS - START)))
  if ((left < 20)); then
    log "$name: skipped (${left}s left of ${TOTAL_BUDGET}s)"
    return 124
  fi
  ((left > STEP_TIMEOUT)) && left=$STEP_TIMEOUT
  log "$name: start (timeout ${left}s): $*"
  timeout --kill-after=10 "$left" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  log "$name: rc=$rc$( ((rc == 124 || rc == 137)) && echo ' (timed out)')"
  tail -n 3 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
  return "$rc"
}

probe() { # probe PYTHON: does it have CUDA torch, vllm and tandem?
  "$1" - <<'EOF' 2>/dev/null
import os
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
import torch, vllm, tandem.cli.main
assert torch.cuda.is_available() or os.environ.get("GPU_CHECK_ALLOW_CPU"), "no CUDA"
print(f"torch {torch.__version__} cuda {torch.version.cuda} on {torch.cuda.get_device_name(0)}; vllm {vllm.__version__}")
EOF
}

# The install, as one command for `step` (timeout runs commands, not shell functions); $0 is the venv.
# shellcheck disable=SC2016  # expanded by the inner bash, where $0 is the venv
INSTALL='set -e
[ -x "$0/bin/python" ] || python3 -m venv --system-site-packages "$0"
"$0/bin/python" -m pip install -q --upgrade pip
"$0/bin/python" -m pip install -q vllm
"$0/bin/python" -m pip install -q -e ".[dev]"'

# -- 1. python with CUDA torch + vllm + tandem ------------------------------------------------------------
log "gpu_check on $(hostname); $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
PY=""
for cand in "${GPU_PYTHON:-}" "$VENV/bin/python" python3; do
  if [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 && probe "$cand" >>"$SUMMARY"; then
    PY=$cand
    break
  fi
done
if [ -z "$PY" ]; then
  step setup bash -c "$INSTALL" "$VENV"
  if probe "$VENV/bin/python" >>"$SUMMARY"; then
    PY="$VENV/bin/python"
  else
    log "setup: no python with CUDA torch + vllm + tandem (no registry reachable?): vLLM steps will fail"
    PY=$([ -x "$VENV/bin/python" ] && echo "$VENV/bin/python" || echo python3)
  fi
fi
log "python: $PY"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONUNBUFFERED=1

# -- 2. engine contract test on CUDA ---------------------------------------------------------------------
step contract "$PY" -m pytest -q -p no:cacheprovider -rs tests/unit/rollout/test_engine_contract.py

# -- 3. colocated and decoupled GRPO with rollout.backend=vllm -------------------------------------------
for mode in colocated decoupled; do
  step "$mode" "$PY" -m tandem.cli.main train configs/quickstart.yaml rollout.backend=vllm \
    "trainer.total_steps=$STEPS" "run.output_dir=$WORK/$mode" "architecture.mode=$mode" \
    monitor.eval_every=0 checkpoint.every=0
done
"$PY" - "$WORK" >>"$SUMMARY" 2>&1 <<'EOF'
import json, statistics, sys
from pathlib import Path

for mode in ("colocated", "decoupled"):
    path = Path(sys.argv[1]) / mode / "metrics.jsonl"
    if not path.exists():
        print(f"{mode}: no metrics.jsonl")
        continue
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keys = sorted({k for r in rows for k in r if k.startswith("timing/") or "sync" in k})
    print(f"{mode}: {len(rows)} metric rows; median over rows (seconds unless named)")
    for k in keys:
        vals = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
        if vals:
            print(f"    {k:<36} {statistics.median(vals):.4g}  (n={len(vals)}, max {max(vals):.4g})")
EOF

# -- 4. tokens/s: hf vs vllm vs HF generate (TRL's path) on CUDA -------------------------------------------
# shellcheck disable=SC2086  # ENGINE_SIZES is a list of words
step engines "$PY" bench/engines.py --quick --sizes ${ENGINE_SIZES:-100m 400m}
sed -n '/^| model/,$p' "$OUT/engines.log" >>"$SUMMARY"

log "done in $((SECONDS - START))s; files in $OUT: $(cd "$OUT" && echo *)"
