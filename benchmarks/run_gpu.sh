#!/usr/bin/env bash
# Qualifies the GPU build in calls that each fit the GPU machine's limits (a command runs
# at most 10 minutes, the machine is handed back after 30 s idle so every call builds
# again, and at most 8 files come back). Steps:
#
#   build     pip install -e . for sm_90 (its log goes in the archive)
#   quick     the checks that matter most, at most QUICK_BUDGET s (300). First the open
#             questions of issue 27: side work in bubbles the host queued ahead of the
#             GPU under one hardware queue and the default (launches at opens, and the
#             negative control without them), training's graph captures beside side work
#             and busy job threads, exit with an open still ahead of the GPU, and close
#             with an item that never returns. Then the GPU basics (exactly-once under
#             gate flips, stream-ordered close, no item inside compute, device syncs),
#             nothing queued behind side work (training's copy, close, a preemption and a
#             cancel beside a long side task, 1 and 8 hardware queues, both reserves),
#             memory lifetime and input stream order, stream-ordered gate writes, the
#             reserve's no-deadlock and admission tests, the step stream's order, the
#             RawKernel example, and compute-sanitizer's memcheck over the example
#   tests     every test file, GPU and CPU tests alike, each in its own process
#   bench     every benchmark in GPU mode, and `bench ranks` on the machine's cores
#
# Every test file runs under its own hard limit (benchmarks/watchdog.py) with faulthandler
# on, so a hang costs that file and prints its stacks: native ones too where py-spy is
# there (its wheel carried in .whl/, below: name .whl in the call's carry); a step stops
# starting files when
# its budget (STEP_BUDGET s, 480) is nearly spent and lists what it did not run, so a call
# never reaches the machine's limit. Everything lands in $OUT as two files: summary.txt
# (one line per file or benchmark: status, seconds, pytest's last line) and results.tgz
# (every log, the JSON of each benchmark, the plots, gpu.csv), re-packed after every
# file so a call cut short still brings back what it did.
#
# Usage (one device call each):
#   STEPS="build quick" benchmarks/run_gpu.sh
#   STEPS="build tests" benchmarks/run_gpu.sh
#   STEPS="build bench" benchmarks/run_gpu.sh
# TESTS="test_gpu.py test_gate.py" limits the tests step to those files.
set -uo pipefail
out=${OUT:-benchmarks/results/new}
mkdir -p "$out"
work=$(mktemp -d)
steps=" ${STEPS:-build quick} "
export FREERIDE_CUDA_ARCHS=${FREERIDE_CUDA_ARCHS:-90}
export FREERIDE_COMMIT=${FREERIDE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
py=python3
# Wheels carried in .whl/ (the machine has no network): pyzmq, which the job queue needs
# and the image lacks, and py-spy for the watchdog. Fetch them here with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl pyzmq py-spy
if ls .whl/*.whl >/dev/null 2>&1; then
  $py -m pip install -q --no-index --no-deps --target /tmp/fr-tools .whl/*.whl \
    && export PATH=$PATH:/tmp/fr-tools/bin PYTHONPATH=/tmp/fr-tools${PYTHONPATH:+:$PYTHONPATH}
fi
step() { [[ "$steps" == *" $1 "* ]]; }
summary="$out/summary.txt"
start=$SECONDS

pack() { tar czf "$out/results.tgz" -C "$work" . 2>/dev/null; }
note() { printf '%s\n' "$*" | tee -a "$summary"; }

# run NAME LIMIT CMD...: runs CMD under a hard limit (the watchdog dumps the stacks of a
# hang, then SIGABRT), logs to NAME.log, adds a summary line, re-packs.
run() {
  local name=${1//[^A-Za-z0-9_.-]/_} limit=$2; shift 2
  local t0=$SECONDS rc
  $py benchmarks/watchdog.py "$limit" "$@" >"$work/$name.log" 2>&1
  rc=$?
  local last status=ok
  last=$(grep -E "(passed|failed|error|skipped|no tests ran)" "$work/$name.log" | tail -1)
  [ $rc -ne 0 ] && status="rc=$rc"
  [ $rc -eq 124 ] && status="TIMEOUT(${limit}s)"
  note "$(printf '%-44s %-14s %4ss  %s' "$name" "$status" $((SECONDS - t0)) "$last")"
  pack
  return $rc
}

# budgeted DEADLINE NAME LIMIT CMD...: run, with the limit cut to what is left before
# DEADLINE (SECONDS), or skipped (listed) when less than 15 s is left.
budgeted() {
  local deadline=$1 name=$2 limit=$3; shift 3
  local left=$((deadline - SECONDS))
  if [ $left -lt 15 ]; then note "$(printf '%-44s %-14s' "$name" "NOT RUN (budget)")"; return 0; fi
  [ $left -lt "$limit" ] && limit=$left
  run "$name" "$limit" "$@"
}

pytest_file() {  # pytest_file DEADLINE LIMIT FILE [pytest args]
  local deadline=$1 limit=$2 file=$3; shift 3
  budgeted "$deadline" "$(basename "$file" .py)${1:+ $*}" "$limit" \
    $py -X faulthandler -m pytest -q -p no:cacheprovider "$file" "$@"
}

note "freeride GPU qualification: commit $FREERIDE_COMMIT, steps:$steps, $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$work/gpu.csv" 2>&1
note "gpu: $(tail -1 "$work/gpu.csv")"

if step build; then
  run build 420 $py -m pip install --no-build-isolation --no-deps -e . || { pack; exit 1; }
  $py -c "import freeride as fr, json; print(json.dumps(fr.backend_info(), indent=1))" \
    >"$work/backend_info.json" 2>&1
  note "backend: $($py -c "import freeride as fr; i = fr.backend_info(); print(i['cuda'], i['gate_write'], i['reserve_mechanism'])" 2>&1 | tail -1)"
fi

if step quick; then
  deadline=$((SECONDS + ${QUICK_BUDGET:-300}))
  # Issue 27's open questions first (each answers what no CPU can), then stream order and
  # nothing behind side work, then memory safety, then the rest.
  pytest_file $deadline 120 tests/test_launch_at_open.py -m gpu
  pytest_file $deadline 90 tests/test_capture.py -m gpu
  pytest_file $deadline 30 tests/test_gpu.py -m gpu -k process_exits
  pytest_file $deadline 40 tests/test_raw_kernel_gpu.py -m gpu -k "close_abandons or some_blocks"
  pytest_file $deadline 90 tests/test_hardware_queues.py -m gpu
  if command -v compute-sanitizer >/dev/null; then
    budgeted $deadline memcheck_example 60 compute-sanitizer --tool memcheck \
      --error-exitcode 99 $py examples/raw_kernel.py
  else
    note "memcheck_example                             NOT RUN (no compute-sanitizer)"
  fi
  pytest_file $deadline 70 tests/test_gpu.py -m gpu
  pytest_file $deadline 30 tests/test_lifetime.py -m gpu
  pytest_file $deadline 30 tests/test_gate_write.py -m gpu
  pytest_file $deadline 50 tests/test_reserve_gpu.py -m gpu -k "deadlock or admission or probe"
  pytest_file $deadline 20 tests/test_iterative.py -m gpu -k stream
  budgeted $deadline example 30 $py -X faulthandler examples/raw_kernel.py
fi

if step tests; then
  deadline=$((SECONDS + ${STEP_BUDGET:-480}))
  files=${TESTS:-$(cd tests && ls test_*.py)}
  for f in $files; do
    pytest_file $deadline 120 "tests/$f"
  done
fi

if step bench; then
  deadline=$((SECONDS + ${STEP_BUDGET:-480}))
  for b in preempt items pipeline; do
    extra=()
    [ "$b" = preempt ] && extra=(--plot "$work/preempt.png")
    limit=150
    [ "$b" = pipeline ] && limit=240  # two runs: the default hardware queues and one
    budgeted $deadline "bench_$b" $limit $py -m freeride bench "$b" --mode gpu \
      --out "$work/$b.json" "${extra[@]}"
  done
  budgeted $deadline bench_ranks 150 $py -m freeride bench ranks --mode cpu --out "$work/ranks.json"
fi

note "total ${SECONDS}s (started at ${start}s)"
pack
