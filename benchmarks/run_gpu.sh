#!/usr/bin/env bash
# One call on a GPU machine: build, run the whole test suite (GPU tests included) and the
# RawKernel example, then every benchmark in GPU mode, and `bench ranks` on the machine's
# CPU cores (the host backend's overhead on a machine with 8 or more cores). Each step runs under its own
# timeout, so a hang costs that step, not the call; a hung step prints its Python stacks
# (SIGABRT with faulthandler).
# Results land in ${OUT:-benchmarks/results/new}: JSON per benchmark, the pause-latency
# plot, the logs. Usage: FREERIDE_COMMIT=$(git rev-parse --short HEAD) benchmarks/run_gpu.sh
# STEPS (default "build tests example preempt items pipeline ranks") picks steps.
set -uo pipefail
out=${OUT:-benchmarks/results/new}
mkdir -p "$out"
steps=" ${STEPS:-build tests example preempt items pipeline ranks} "
export FREERIDE_CUDA_ARCHS=${FREERIDE_CUDA_ARCHS:-90}
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
py=python3
step() { [[ "$steps" == *" $1 "* ]]; }

if step build; then
  timeout 600 $py -m pip install --no-build-isolation --no-deps -e . >"$out/build.log" 2>&1 \
    || { tail -50 "$out/build.log"; exit 1; }
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$out/gpu.csv" 2>&1
if step tests; then
  # A per-test limit where pytest-timeout is installed (a GPU machine may have no network
  # to install it); the step's own timeout bounds the run either way.
  per_test=()
  $py -c "import pytest_timeout" 2>/dev/null && per_test=(-o timeout=300)
  timeout -s ABRT "${TESTS_TIMEOUT:-900}" $py -m pytest -q -p no:cacheprovider "${per_test[@]}" tests \
    2>&1 | tee "$out/tests.log" | tail -30
fi
if step example; then
  timeout -s ABRT 300 $py examples/raw_kernel.py 2>&1 | tee "$out/example_raw_kernel.log" | tail -5
fi
for b in preempt items pipeline; do
  step "$b" || continue
  extra=()
  [ "$b" = preempt ] && extra=(--plot "$out/preempt.png")
  timeout -s ABRT "${BENCH_TIMEOUT:-300}" $py -m freeride bench "$b" --mode gpu --out "$out/$b.json" \
    "${extra[@]}" 2>&1 | tee "$out/$b.log"
done
if step ranks; then
  timeout -s ABRT "${BENCH_TIMEOUT:-300}" $py -m freeride bench ranks --mode cpu --out "$out/ranks.json" \
    2>&1 | grep -v "^  step" | tee "$out/ranks.log"
fi
