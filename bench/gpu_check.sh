#!/usr/bin/env bash
# One prepared check of the vLLM rollout engine on a lent GPU machine, run as ONE call from the repository root:
#
#     bash bench/gpu_check.sh            # results in $OUT (default ./gpu_check_out)
#
# Steps, each under `timeout $STEP_TIMEOUT` (480 s) and all under $TOTAL_BUDGET (570 s, so the call fits the
# device's 10-minute command limit; a step gets what is left, and a step with < 20 s left is skipped):
#   0. wheels carried in ./.whl (a machine with no package registry): installed with --no-index into
#      /tmp/site, which goes on PYTHONPATH with the repository root (see "Offline machines" below).
#   1. python: $GPU_PYTHON, else ./.venv-gpu, else the machine's python3, whichever imports torch with CUDA,
#      vllm and tandem; with carried wheels, else the first that imports torch with CUDA and tandem (the
#      vLLM steps are then skipped, saying so); otherwise create .venv-gpu (--system-site-packages, reusing
#      the image's packages) and pip install vllm (the CUDA build, which brings its own torch) and the repo
#      (-e ".[dev]"). Without a package registry this install fails; later steps then say so.
#   2. the engine contract test (tests/unit/rollout/test_engine_contract.py): vLLM on CUDA.
#   3. the test suite (`make test`'s selection, $SUITE_WORKERS xdist workers) on this machine: another CPU,
#      another torch build, CUDA present. A test asserting on where a chaotic run lands, or a code path that
#      changes when torch.cuda.is_available(), shows here. summary.txt groups the failures by their error
#      line (a package the machine lacks shows as one ModuleNotFoundError group).
#   4. a colocated and a decoupled GRPO run of configs/quickstart.yaml with rollout.backend=vllm, 20 steps,
#      then the median timing/* and weight-sync metrics of each (metrics.jsonl).
#   5. bench/engines.py --quick on the 100m and 400m models (hf / vllm / trl generate tokens/s on CUDA).
# Offline machines (the lent H200 image has torch, transformers, peft and pytest but no pydantic or vllm):
# carry the missing wheels in ./.whl (ignored through .git/info/exclude, named in the device call's
# carry). vLLM is too large to carry, so steps 2, 4 and 5 need a machine that can reach a registry.
# The 22 wheels used on 2026-12-04 (versions from constraints.txt; 11 MB), fetched here with
#     echo /.whl/ >> .git/info/exclude
#     pkgs="pydantic pydantic_core annotated-types typing-inspection fastapi starlette uvicorn httptools openai
#       jiter distro sniffio httpx2 httpcore2 truststore idna trl datasets dill multiprocess redis verl"
#     .venv/bin/pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       --platform manylinux1_x86_64 -d .whl -c constraints.txt $pkgs
# A dry run of the script's plumbing on a CPU machine (no install, small models):
#     GPU_PYTHON=.venv/bin/python GPU_CHECK_ALLOW_CPU=1 STEPS=2 ENGINE_SIZES=1m bash bench/gpu_check.sh
# $OUT holds at most 8 files (the device returns no more): summary.txt (everything that matters), one
# log per step and the suite's junit.xml; the run folders stay in $WORK (outside $OUT: too many files to bring back).
set -uo pipefail

OUT=${OUT:-$PWD/gpu_check_out}
WORK=${WORK:-/tmp/tandem_gpu_check}
STEP_TIMEOUT=${STEP_TIMEOUT:-480}
TOTAL_BUDGET=${TOTAL_BUDGET:-570}
VENV=${GPU_VENV:-.venv-gpu}
STEPS=${STEPS:-20}
SUITE_WORKERS=${SUITE_WORKERS:-$(($(nproc) > 2 ? $(nproc) - 2 : 1))}
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

probe() { # probe PYTHON [core]: does it have CUDA torch, tandem and (unless "core") vllm?
  NEED_VLLM=$([ "${2:-}" = core ] && echo 0 || echo 1) "$1" - <<'EOF' 2>/dev/null
import os
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
import torch, tandem.cli.main
assert torch.cuda.is_available() or os.environ.get("GPU_CHECK_ALLOW_CPU"), "no CUDA"
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
try:
    import vllm
    engine = f"vllm {vllm.__version__}"
except ImportError:
    assert os.environ["NEED_VLLM"] == "0", "no vllm"
    engine = "no vllm"
print(f"torch {torch.__version__} cuda {torch.version.cuda} on {gpu}; {engine}")
EOF
}

# The install, as one command for `step` (timeout runs commands, not shell functions); $0 is the venv.
# shellcheck disable=SC2016  # expanded by the inner bash, where $0 is the venv
INSTALL='set -e
[ -x "$0/bin/python" ] || python3 -m venv --system-site-packages "$0"
"$0/bin/python" -m pip install -q --upgrade pip
"$0/bin/python" -m pip install -q vllm
"$0/bin/python" -m pip install -q -e ".[dev]"'

# -- 0. carried wheels -------------------------------------------------------------------------------------
log "gpu_check on $(hostname); $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
CARRIED=0
if compgen -G ".whl/*.whl" >/dev/null; then
  CARRIED=1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl >>"$SUMMARY" 2>&1 && log "installed $(find .whl -type f -name '*.whl' | wc -l) carried wheels into /tmp/site"
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

# -- 1. python with CUDA torch + vllm + tandem (offline: without vllm) -------------------------------------
PY=""
CANDS=("${GPU_PYTHON:-}" "$VENV/bin/python" python3)
for need in all core; do
  [ $need = core ] && ((!CARRIED)) && break # with a registry, install vllm below instead
  for cand in "${CANDS[@]}"; do
    if [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 && probe "$cand" $need >>"$SUMMARY"; then
      PY=$cand
      break 2
    fi
  done
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

VLLM=1
if ! VLLM_ENABLE_V1_MULTIPROCESSING=0 "$PY" -c "import vllm" >/dev/null 2>&1; then
  VLLM=0
  log "vllm does not import with $PY: the vLLM steps (contract, colocated, decoupled, engines) are skipped"
fi

# -- 2. engine contract test on CUDA ---------------------------------------------------------------------
((VLLM)) && step contract "$PY" -m pytest -q -p no:cacheprovider -rs tests/unit/rollout/test_engine_contract.py

# -- 3. the test suite on this machine ---------------------------------------------------------------------
# shellcheck disable=SC2086  # SUITE_ARGS is a list of words
# A module that cannot import (a package the machine lacks) is one collection error, not the end of the run.
OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false step suite "$PY" -m pytest -q -p no:cacheprovider \
  -n "$SUITE_WORKERS" --dist worksteal --timeout "${SUITE_TEST_TIMEOUT:-120}" --continue-on-collection-errors \
  -m "not heavy" --junitxml="$OUT/junit.xml" ${SUITE_ARGS:-tests}
"$PY" - "$OUT/junit.xml" >>"$SUMMARY" 2>&1 <<'EOF'
import collections, sys
import xml.etree.ElementTree as ET

try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError) as e:
    sys.exit(f"suite: no junit.xml ({e})")
counts, groups = collections.Counter(), collections.defaultdict(list)
for case in root.iter("testcase"):
    bad = case.find("failure") if case.find("failure") is not None else case.find("error")
    kind = "failed" if bad is not None else "skipped" if case.find("skipped") is not None else "passed"
    counts[kind] += 1
    if bad is not None:
        line = ((bad.get("message") or bad.text or "?").strip().splitlines() or ["?"])[0][:160]
        groups[line].append(f"{case.get('classname')}::{case.get('name')}")
print("suite:", ", ".join(f"{n} {k}" for k, n in counts.most_common()))
for line, tests in sorted(groups.items(), key=lambda kv: -len(kv[1])):
    print(f"  {len(tests):4d} x {line}")
    for t in tests[:4]:
        print(f"         {t}")
EOF

# -- 4. colocated and decoupled GRPO with rollout.backend=vllm -------------------------------------------
if ((VLLM)); then
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


# -- 5. tokens/s: hf vs vllm vs HF generate (TRL's path) on CUDA -------------------------------------------
# shellcheck disable=SC2086  # ENGINE_SIZES is a list of words
step engines "$PY" bench/engines.py --quick --sizes ${ENGINE_SIZES:-100m 400m}
sed -n '/^| model/,$p' "$OUT/engines.log" >>"$SUMMARY"
fi

log "done in $((SECONDS - START))s; files in $OUT: $(cd "$OUT" && echo *)"
