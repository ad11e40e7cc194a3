#!/usr/bin/env bash
# One call on a GPU machine: build, run the GPU tests and the RawKernel example, run every
# benchmark in GPU mode.
# Results land in ${OUT:-benchmarks/results/new}: JSON per benchmark, the pause-latency
# plot, the test log. Usage: FREERIDE_COMMIT=$(git rev-parse --short HEAD) benchmarks/run_gpu.sh
set -uo pipefail
out=${OUT:-benchmarks/results/new}
mkdir -p "$out"
export FREERIDE_CUDA_ARCHS=${FREERIDE_CUDA_ARCHS:-90}
pip install --no-build-isolation --no-deps -e . >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$out/gpu.csv" 2>&1
python -m pytest -q -m gpu tests 2>&1 | tee "$out/gpu_tests.log" | tail -25
python examples/raw_kernel.py 2>&1 | tee "$out/example_raw_kernel.log" | tail -5
for b in preempt items pipeline; do
  extra=()
  [ "$b" = preempt ] && extra=(--plot "$out/preempt.png")
  python -m freeride bench "$b" --mode gpu --out "$out/$b.json" "${extra[@]}" 2>&1 | tee "$out/$b.log"
done
