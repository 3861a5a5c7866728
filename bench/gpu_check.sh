#!/usr/bin/env bash
# dsenv on one lent GPU, in one call: install from carried wheels (no network there), then the
# doctor against ds_report, the smokes, the full bert-squad run on a bert-base-shaped model
# served by the project's test Hub (tests/harness/hubserver.py, on 127.0.0.1), plain PyTorch
# against DeepSpeed configurations with profiles, and `doctor --distributed`. Every step runs
# under its own `timeout` inside one time budget, a failed step is recorded (rc, the end of its
# output) and the next one runs; the figures go to ONE JSON file, rewritten after each step.
#
#   bash bench/gpu_check.sh              # on the GPU machine, from the repository root, with
#                                        # the wheels in .whl/ (see bench/README.md)
#   bash bench/gpu_check.sh --cpu-dry    # here: the same steps at tiny sizes on the CPU
#
# Output: $OUT/gpu.json (figures), $OUT/gpu-log.txt (every step's output), $OUT/doctor.json,
# $OUT/fullrun-report.json. Without $OUT: /tmp/gpu-check-out/.
#
# Environment knobs: GPU_CHECK_BUDGET_S (480), GPU_CHECK_ARCH (9.0a: the arch list the vendor
# image sets; the doctor and the smokes run with it), GPU_CHECK_FALLBACK_ARCH (9.0: used for
# the rest when the first smoke fails under GPU_CHECK_ARCH; DeepSpeed 0.19.8's JIT builder
# cannot parse "9.0a", recorded earlier), GPU_CHECK_SKIP_INSTALL=1, GPU_CHECK_WORK (/tmp/gc).
set -u
T0=$(date +%s)
cd "$(dirname "$0")/.."
ROOT=$PWD

DRY=0
[[ "${1:-}" == "--cpu-dry" || "${GPU_CHECK_CPU_DRY:-0}" == 1 ]] && DRY=1
BUDGET=${GPU_CHECK_BUDGET_S:-$((DRY ? 1800 : 480))}
SCALE=$((DRY ? 4 : 1))  # step timeouts: the 2-core CPU machine is slower than the GPU node
ARCH=${GPU_CHECK_ARCH:-9.0a}
FALLBACK_ARCH=${GPU_CHECK_FALLBACK_ARCH:-9.0}
O=${OUT:-/tmp/gpu-check-out}
W=${GPU_CHECK_WORK:-/tmp/gc}
mkdir -p "$O"
rm -rf "$W" && mkdir -p "$W"
J=$O/gpu.json
LOG=$O/gpu-log.txt
: >"$LOG"
IMAGE_ARCH=${TORCH_CUDA_ARCH_LIST-unset}

export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_ROOT_USER_ACTION=ignore HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
if ((DRY)); then
  # CPU dry run: DeepSpeed's CPU accelerator, tiny sizes; the CPU op (deepspeed_shm_comm)
  # builds once into a folder that outlives the run
  export DS_ACCELERATOR=cpu MASTER_ADDR=127.0.0.1 GLOO_SOCKET_IFNAME=lo
  export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$HOME/.cache/dsenv-tests/torch_extensions}
  PY=${PYTHON:-python3}
  MODE=cpu-dry
else
  export TORCH_EXTENSIONS_DIR=/tmp/ext
  PY=python3
  MODE=gpu
fi

say() { echo "=== $(date +%T) +$(($(date +%s) - T0))s $*" | tee -a "$LOG"; }
HELPER=("$PY" "$ROOT/bench/gpu_check.py")  # an array: `timeout` runs it (no shell functions)
helper() { "${HELPER[@]}" "$@"; }

# step NAME MAX_SECONDS [--report FILE --key KEY] -- COMMAND...: COMMAND under `timeout`
# (MAX_SECONDS or what is left of the budget), its output into the log, rc/wall/error tail
# into the JSON; with --report, that run report summarised under KEY. Sets STEP_RC.
step() {
  local name=$1 max=$2
  shift 2
  local extra=()
  while [[ $1 != -- ]]; do extra+=("$1"); shift; done
  shift
  local now left t
  now=$(date +%s)
  left=$((BUDGET - (now - T0) - 10))
  if ((left < 20)); then
    say "step $name: skipped, ${left}s of the budget left"
    helper record --json "$J" --step "$name" --rc -1 --wall 0 --note "skipped: time budget" \
      "${extra[@]}"
    STEP_RC=-1
    return
  fi
  max=$((max * SCALE))
  t=$((max < left ? max : left))
  export STEP_DEADLINE=$((now + t))
  say "step $name (timeout ${t}s): $*"
  local s e
  s=$(date +%s.%N)
  timeout -k 10 "$t" "$@" >"$W/$name.log" 2>&1
  STEP_RC=$?
  e=$(date +%s.%N)
  cat "$W/$name.log" >>"$LOG"
  local wall
  wall=$(awk -v a="$s" -v b="$e" 'BEGIN{printf "%.1f", b-a}')
  echo "--- rc=$STEP_RC wall=${wall}s : $name" >>"$LOG"
  helper record --json "$J" --step "$name" --rc "$STEP_RC" --wall "$wall" --timeout "$t" \
    --log "$W/$name.log" "${extra[@]}" | tee -a "$LOG"
}

helper init --json "$J" --mode "$MODE" --budget "$BUDGET" \
  --set "arch.image=\"$IMAGE_ARCH\"" --set "arch.doctor_and_smokes=\"$ARCH\""
say "gpu_check mode=$MODE budget=${BUDGET}s out=$O work=$W image TORCH_CUDA_ARCH_LIST=$IMAGE_ARCH"

# ---------------------------------------------------------------- 0. install (no network)
if ((DRY)) || [[ ${GPU_CHECK_SKIP_INSTALL:-0} == 1 ]]; then
  say "install: skipped (dry run or GPU_CHECK_SKIP_INSTALL=1); dsenv is $(command -v dsenv)"
else
  step install_wheels 120 -- "$PY" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade .whl/*.whl
  step install_deepspeed 150 -- env DS_BUILD_OPS=0 "$PY" -m pip install -q --no-index \
    --no-deps --no-build-isolation --no-cache-dir .whl/deepspeed-*.tar.gz
  step install_dsenv 90 -- "$PY" -m pip install -q --no-index --no-deps --no-build-isolation \
    --no-cache-dir .
  hash -r
fi

# ---------------------------------------------------------------- 1. what is here
export TORCH_CUDA_ARCH_LIST=$ARCH
step env 90 -- "${HELPER[@]}" env --json "$J" --key env

# ---------------------------------------------------------------- 2. doctor vs ds_report
step doctor 120 -- "${HELPER[@]}" doctor --json "$J" --key doctor --rounds 3 --save "$O/doctor.json"

# ---------------------------------------------------------------- 3. the first smoke
SMOKE_STEPS=()
((DRY)) && SMOKE_STEPS=(--steps 20)  # the smoke's own hidden flag: a shorter schedule
smoke() {  # smoke NAME MAX WORKLOAD PRESET
  step "smoke_$1" "$2" --report "$W/smoke-$1/report.json" --key "smokes.$1" -- \
    dsenv smoke "$3" --preset "$4" --output-dir "$W/smoke-$1" --examples 1 "${SMOKE_STEPS[@]}"
  helper set --json "$J" "smokes.$1.arch=\"$TORCH_CUDA_ARCH_LIST\"" \
    "smokes.$1.command=\"dsenv smoke $3 --preset $4\""
}
# compiles fused_adam on the GPU (~35 s on 16 cores) into TORCH_EXTENSIONS_DIR
smoke bert-squad-bf16 200 bert-squad bf16
# rc 1 is also a verdict that failed (a run that trained): fall back only on an arch error,
# a crash or a timeout
if ((STEP_RC != 0)) && ((!DRY)) && [[ $ARCH != "$FALLBACK_ARCH" ]] &&
  { ((STEP_RC != 1)) || grep -qE \
    "invalid literal for int|Unsupported gpu architecture|nvcc fatal|Traceback" \
    "$W/smoke_bert-squad-bf16.log"; }; then
  say "first smoke failed with TORCH_CUDA_ARCH_LIST=$ARCH: the rest runs with $FALLBACK_ARCH"
  export TORCH_CUDA_ARCH_LIST=$FALLBACK_ARCH
  helper set --json "$J" \
    "arch.fallback_reason=\"smoke bert-squad bf16 failed (rc $STEP_RC) with $ARCH\""
  smoke bert-squad-bf16-arch-fallback 200 bert-squad bf16
fi
helper set --json "$J" "arch.used_after_first_smoke=\"$TORCH_CUDA_ARCH_LIST\""

# ---------------------------------------------------------------- 4. the full run
if ((DRY)); then
  FULL=(--tiny --steps 6 --micro-batch 4 --rows 120 --eval-rows 16)
else
  FULL=(--steps 60 --micro-batch 32 --rows 5000 --eval-rows 64)
fi
step fullrun 240 -- bash -c 'exec "$0" "$1/bench/gpu_check.py" fullrun --json "$2" \
  --key fullrun --work "$3/fullrun" --save "$4/fullrun-report.json" --deadline "$STEP_DEADLINE" \
  "${@:5}"' "$PY" "$ROOT" "$J" "$W" "$O" "${FULL[@]}"

# ---------------------------------------------------------------- 5+6. plain vs DeepSpeed
if ((DRY)); then
  LOOP=(--tiny --micro-batch 4 --seq 64 --warm 2 --steps 4 --profile-steps 2)
else
  LOOP=(--micro-batch 32 --seq 384 --warm 5 --steps 30 --profile-steps 5)
fi
step loops 200 -- bash -c 'exec "$0" "$1/bench/gpu_plain_loop.py" --json "$2" --key loops \
  --ds-config-from "$3/fullrun/run/report.json" \
  --ds-config-from "$3/smoke-bert-squad-bf16-arch-fallback/report.json" \
  --ds-config-from "$3/smoke-bert-squad-bf16/report.json" \
  --deadline "$STEP_DEADLINE" "${@:4}"' "$PY" "$ROOT" "$J" "$W" "${LOOP[@]}"

# ---------------------------------------------------------------- 3 (cont.). more smokes
if ((DRY)); then
  say "dry run: fp16 needs a GPU; its smokes run anyway to check the flags (expect rc 2)"
fi
smoke bert-squad-fp16 90 bert-squad fp16
smoke bert-squad-zero2 90 bert-squad zero2
smoke bert-mrpc-fp16 90 bert-mrpc fp16
smoke gpt2-wikitext-bf16 90 gpt2-wikitext bf16

# ---------------------------------------------------------------- 7. doctor --distributed
# -n 1 is refused ("one rank has nobody to talk to"); on one GPU two ranks share it, which
# the doctor reports as distributed.devices (rc 1): the run still shows launch and rendezvous
step distributed 60 --tail-key distributed -- dsenv doctor --distributed --launch torchrun -n 2

helper set --json "$J" "total_wall_s=$(($(date +%s) - T0))"
say "done in $(($(date +%s) - T0))s"
helper summary --json "$J" | tee -a "$LOG"
exit 0
