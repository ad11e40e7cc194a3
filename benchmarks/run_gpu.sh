#!/usr/bin/env bash
# Qualifies the GPU build in calls that each fit the GPU machine's limits (a command runs
# at most 10 minutes, the device time of a session is short, every call on a fresh machine
# builds again, and at most 8 files come back). Steps:
#
#   build     pip install -e . for sm_90 (its log goes in the archive; ~25 s)
#   measure   issue 36's "measured in one run", in MEASURE_BUDGET s (480: with the build,
#             one 9-minute command): `bench preempt` (pause latency per item duration,
#             host cost per close+open pair; MEASURE_QUICK=1 for --quick), side
#             admission device-started and host-started, by the executor and by the
#             watcher (FREERIDE_WATCHER_LAUNCH=1) (probe_admission.py, 200 trials),
#             harvest of open-gate time in queued bubbles under 8 and 1 hardware queues
#             for a single-phase and a many-phase task (probe_harvest_matrix.py), G2's
#             other-stream probe with the lookahead bound off and on (probe_channels.py),
#             `bench pipeline` and `bench items` (item overhead, bandwidth against a
#             copy), `bench hooks` through benchmarks/hook_cost.py (the host cost per
#             pair through the hooks, bubble record on, and each kind of CUDA call a pair
#             makes timed alone); then benchmarks/measure_table.py's table of them against the
#             targets, into summary.txt, the archive and $OUT/measure_table.md
#   qualify   the default, run first: what the second 2026-11-27 H200 run (at cf361a5)
#             left open, in QUALIFY_BUDGET s (480: with the build, one 9-minute command),
#             most important first: tests/test_hardware_queues.py (it hung: a launch ran on
#             through a close it never saw; fixed since, a launch never runs in two
#             bubbles), tests/test_launch_at_open.py and probe_queued_harvest.py (harvest
#             in queued bubbles, after the fix for blocks that left a launch whose close
#             was pending), the G1 and G4 tests beside the new claim rule (successors on
#             and off), the executor's sleep test, compute-sanitizer's memcheck over
#             benchmarks/probes/memcheck_small.py (API errors not reported), the device
#             phases tests (on by default since they passed there), `bench preempt` and
#             `bench pipeline` with --quick; then what else first ran on a GPU in that
#             run and passed (phases ahead, the watcher's launch, G16's clock origin, the
#             carveout probe, probe_pause.py), then, where time is left, the rest of the 2026-11-26 review's list, all passed on 2026-11-27:
#             the abandon-in-a-green-context probe, the cudaFree removal's reruns (exit,
#             close), the hardware-queue probe, stream creation beside side work, the
#             admission probe, the lifetime tests, G18's partition and JIT tests, the F12
#             launch, mem_get_info beside a capture, the capture tests and the rest of
#             tests/test_gpu.py. Probes are benchmarks/probes/*.py (README there); their
#             RESULT/ANSWER lines, and the benchmarks' main rows, are copied into
#             summary.txt.
#   quick     the checks of the 2026-11-25 run, at most QUICK_BUDGET s (300). First the
#             open questions of issue 27: side work in bubbles the host queued ahead of the
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
#   bench     every benchmark in GPU mode, and `bench ranks` on the machine's cores;
#             benchmarks/hook_cost.py --mode gpu (bench hooks with the stub's rows and
#             the CUDA calls' rows)
#
# Every test file and probe runs under its own hard limit (benchmarks/watchdog.py) with
# faulthandler on, so a hang costs that item and prints its stacks: native ones too where
# py-spy is there (its wheel carried in .whl/, below). A step stops starting items when its
# budget (MEASURE_BUDGET, QUALIFY_BUDGET, QUICK_BUDGET, STEP_BUDGET: 480, 480, 300, 480 s)
# is nearly spent, cuts the last item's limit to what is left, and lists what it did not
# run ("NOT RUN (budget)"), so a call does not reach the machine's limit (a hung item can
# overrun its limit by the watchdog's stack dump and its 10 s grace). Everything lands in
# $OUT as two files (three after measure, its table too): summary.txt (one line per item:
# status, seconds, pytest's last line; the probes' result lines under theirs) and
# results.tgz (every log, the probes' full output, the JSON of each benchmark, the plots,
# gpu.csv, backend_info.json), re-packed after every item so a call cut short still
# brings back what it did.
#
# Usage (one device call each; carry .whl). A session's device time (15 minutes, the
# machine's start and idle time included) holds one qualify and one measure call only
# with smaller budgets: STEPS="build qualify" QUALIFY_BUDGET=340 (~380 s with the
# build: items 1-5b take ~330 s when they pass, so item 6, which the measure step runs
# in full, is the first cut), then STEPS="build measure"
# MEASURE_QUICK=1 MEASURE_BUDGET=300 (~340 s: its estimates add up to ~300 s quick, the
# last items listed NOT RUN where it runs short), and no rerun; the defaults (480 each)
# fit one 10-minute call, not both.
#   benchmarks/run_gpu.sh                       # STEPS="build qualify"
#   STEPS="build measure" benchmarks/run_gpu.sh # issue 36's figures and their table
#   STEPS="build quick" benchmarks/run_gpu.sh
#   STEPS="build tests" benchmarks/run_gpu.sh
#   STEPS="build bench" benchmarks/run_gpu.sh
# TESTS="test_gpu.py test_gate.py" limits the tests step to those files.
set -uo pipefail
out=${OUT:-benchmarks/results/new}
mkdir -p "$out"
work=$(mktemp -d)
steps=" ${STEPS:-build qualify} "
export FREERIDE_CUDA_ARCHS=${FREERIDE_CUDA_ARCHS:-90}
export FREERIDE_COMMIT=${FREERIDE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
py=python3
# Wheels carried in .whl/ (the machine has no network; .whl is git-ignored, so name it in
# the call's carry): pyzmq, which the job queue (and test_capture's busy queue) needs and
# the image lacks, and py-spy for the watchdog's native stacks. The image has torch, CuPy,
# pytest, nvcc and compute-sanitizer. Fetch them here (Python 3.12, x86_64) with
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
  last=$(grep -E "(passed|failed|error|skipped|no tests ran)" "$work/$name.log" \
    | grep -vE "^(RESULT|ANSWER) " | tail -1)
  [ $rc -ne 0 ] && status="rc=$rc"
  [ $rc -eq 124 ] && status="TIMEOUT(${limit}s)"
  note "$(printf '%-44s %-14s %4ss  %s' "$name" "$status" $((SECONDS - t0)) "$last")"
  pack
  return $rc
}

# budgeted DEADLINE NAME LIMIT CMD...: run, with the limit cut to what is left before
# DEADLINE (SECONDS), or skipped (listed) when less than 15 s is left.
budgeted() {  # [BUDGET_NEED=S] budgeted DEADLINE NAME LIMIT COMMAND...: not run with < S s left
  local deadline=$1 name=$2 limit=$3; shift 3
  local left=$((deadline - SECONDS))
  if [ $left -lt "${BUDGET_NEED:-15}" ]; then
    note "$(printf '%-44s %-14s' "$name" "NOT RUN (budget)")"
    return 0
  fi
  [ $left -lt "$limit" ] && limit=$left
  run "$name" "$limit" "$@"
}

pytest_file() {  # pytest_file DEADLINE LIMIT FILE [pytest args]
  local deadline=$1 limit=$2 file=$3; shift 3
  budgeted "$deadline" "$(basename "$file" .py)${1:+ $*}" "$limit" \
    $py -X faulthandler -m pytest -q -p no:cacheprovider "$file" "$@"
}

# results_of NAME: copies the RESULT and ANSWER lines of NAME's log (a probe's findings)
# into the summary, under NAME's line.
results_of() {
  local log="$work/${1//[^A-Za-z0-9_.-]/_}.log"
  [ -f "$log" ] && grep -E '^(RESULT|ANSWER) ' "$log" | cut -c1-600 | sed 's/^/    /' >>"$summary"
  return 0
}

# table_of NAME REGEX: copies the lines of NAME's log that match REGEX (a benchmark's
# table rows, and its header line) into the summary, under NAME's line, cut to 130
# characters (the columns after that are in the archive's JSON).
table_of() {
  local log="$work/${1//[^A-Za-z0-9_.-]/_}.log"
  [ -f "$log" ] && grep -E "^ *variant |$2" "$log" | cut -c1-130 | sed 's/ *$//; s/^/    /' >>"$summary"
  return 0
}

# probe DEADLINE NAME LIMIT [VAR=VALUE ...] SCRIPT [ARGS]: benchmarks/probes/SCRIPT under
# budgeted (python3 -X faulthandler, with those variables set), then its result lines.
probe() {
  local deadline=$1 name=$2 limit=$3; shift 3
  local vars=()
  while [[ $# -gt 0 && "$1" == *=* ]]; do vars+=("$1"); shift; done
  local script=$1; shift
  budgeted "$deadline" "$name" "$limit" \
    env ${vars[@]+"${vars[@]}"} $py -X faulthandler "benchmarks/probes/$script" "$@"
  local rc=$?
  results_of "$name"
  return $rc
}

# stand_in FILE RC NAME: where item NAME ended with status RC (not 0) without writing its
# JSON FILE, a stand-in that says so ({"stand_in": true, "error": ...}), so that
# benchmarks/measure_table.py says "failed" rather than "not run" (an item the budget
# skipped returns 0 and gets none).
stand_in() {
  local file=$1 rc=$2 name=$3 why
  { [ "$rc" -eq 0 ] || [ -f "$file" ]; } && return 0
  why="exited with status $rc"
  [ "$rc" -eq 124 ] && why="timed out (its limit)"
  why="$name $why without writing $(basename "$file") (its log is in the archive)"
  $py -c 'import json, sys; json.dump({"stand_in": True, "error": sys.argv[2]}, \
    open(sys.argv[1], "w"))' "$file" "$why"
}

# measure_bench DEADLINE BENCH LIMIT PATTERN [SCRIPT ARG...] (the measure step):
# `freeride bench BENCH --mode gpu`, or the script given (as `$py SCRIPT ARG...`), with
# --quick where MEASURE_QUICK=1, into "$m/BENCH.json", its stand-in where it wrote none,
# and its rows matching PATTERN in the summary.
measure_bench() {
  local deadline=$1 bench=$2 limit=$3 pattern=$4 quick=()
  shift 4
  local program=("$@")
  [ ${#program[@]} -eq 0 ] && program=(-m freeride bench "$bench")
  # QUICK_ARGS: what MEASURE_QUICK=1 passes instead of --quick (bench pipeline's).
  [ "${MEASURE_QUICK:-0}" = 1 ] && read -r -a quick <<<"${QUICK_ARGS:---quick}"
  budgeted $deadline "measure_bench_$bench" $limit $py "${program[@]}" --mode gpu \
    ${quick[@]+"${quick[@]}"} --out "$m/$bench.json"
  stand_in "$m/$bench.json" $? "measure_bench_$bench"
  table_of "measure_bench_$bench" "$pattern"
}

# The compute-sanitizer of the CUDA toolkit, on PATH or in /usr/local/cuda.
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

note "freeride GPU qualification: commit $FREERIDE_COMMIT, steps:$steps, $(date -u +%FT%TZ)"
# The few commands outside run's watchdog have limits of their own: a wedged driver must
# cost seconds of the call, not all of it.
timeout 30 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv \
  >"$work/gpu.csv" 2>&1
note "gpu: $(tail -1 "$work/gpu.csv")"

if step build; then
  run build 420 $py -m pip install --no-build-isolation --no-deps -e . || { pack; exit 1; }
  timeout 60 $py -c "import freeride as fr, json; print(json.dumps(fr.backend_info(), indent=1))" \
    >"$work/backend_info.json" 2>&1
  note "backend: $(timeout 60 $py -c "import freeride as fr; i = fr.backend_info(); print(i['cuda'], i['gate_write'], i['reserve_mechanism'])" 2>&1 | tail -1)"
fi

if step measure; then
  # Issue 36 item 5, "measured in one run": every figure of the issue's list, then one
  # table of them against their targets (benchmarks/measure_table.py) in the summary, in
  # the archive and as $OUT/measure_table.md. Defaults are measured: the step unsets the
  # settings it varies (in a subshell), and each item sets its own. [~N s] is the estimate
  # on an H200 and where it comes from (results/h200-2026-11-27/: "measured" from its
  # logs, JSON dates and summary, "est." where nothing like it has run on a GPU yet); the
  # number after the name is the hard limit. Estimates add up to ~450 s (the step took
  # 185 s with MEASURE_QUICK=1 at cf361a5, its build aside), the limits to ~840 s: with
  # MEASURE_BUDGET=480 everything runs unless something hangs, and then the last items
  # are listed NOT RUN and their rows say "not run".
  (
    unset FREERIDE_LAUNCH_AT_OPEN FREERIDE_ADMISSION FREERIDE_GATE_WRITE FREERIDE_MAX_LOOKAHEAD \
      FREERIDE_PHASES_AHEAD FREERIDE_SUCCESSORS FREERIDE_FOLLOW FREERIDE_WATCHER_LAUNCH \
      FREERIDE_DEVICE_PHASES FREERIDE_GREEN_WORKQUEUE \
      CUDA_DEVICE_MAX_CONNECTIONS
    deadline=$((SECONDS + ${MEASURE_BUDGET:-480}))
    m="$work/measure"
    mkdir -p "$m"
    # 1. Pause latency p50/p99/max per item duration (1-100 us; the target at 10 us),
    #    from the close taking effect (queued ahead behind a marker), and for the default
    #    once more with the host enqueuing the close as the GPU waits; the host cost per
    #    close+open pair (gate write rows: ring, poll, launch at open), and the
    #    training-kernel admission rows. Full sizes: 300 pause trials a row, enough for a
    #    p99 [~165 s est.: ~153 s at 51c0fe7, between the start dates of its JSON and the
    #    next benchmark's, before the six host-enqueued rows]; MEASURE_QUICK=1 runs
    #    --quick (50 trials) [~28 s est.: 22 s at cf361a5, before the marker rows] under a
    #    limit of 90 s, not 200: the markers' path has not run on a GPU, and a trial that
    #    waits out its marker's 1 s timeout at every row would spend most of the step.
    limit=200
    [ "${MEASURE_QUICK:-0}" = 1 ] && limit=90
    measure_bench $deadline preempt $limit "^ *(no side work|freeride, gate in device)"
    # 2. Side admission, open seen -> first items, 200 trials each (a p99): device-started
    #    (the launch an open enqueues, the default) and host-started (the executor's
    #    ring, FREERIDE_LAUNCH_AT_OPEN=0); each first counts the executor's wake-ups over a
    #    second with the gate closed (it sleeps through compute). [~11 s each est.: 40
    #    trials took 5-8 s measured]
    probe $deadline measure_admission_at_open 30 probe_admission.py --trials 200 \
      --json "$m/admission_at_open.json"
    stand_in "$m/admission_at_open.json" $? measure_admission_at_open
    probe $deadline measure_admission_ring 30 FREERIDE_LAUNCH_AT_OPEN=0 probe_admission.py \
      --trials 200 --json "$m/admission_ring.json"
    stand_in "$m/admission_ring.json" $? measure_admission_ring
    #    Host-started with one wake-up (issue 36 item 1, G8; off by default): the watcher's
    #    thread launches when the GPU reaches the open, then rings (FREERIDE_WATCHER_LAUNCH=1).
    #    [~10 s est.]
    probe $deadline measure_admission_watcher 30 FREERIDE_LAUNCH_AT_OPEN=0 \
      FREERIDE_WATCHER_LAUNCH=1 probe_admission.py --trials 200 --json "$m/admission_watcher.json"
    stand_in "$m/admission_watcher.json" $? measure_admission_watcher
    #    Host-started without a wake-up (off by default): the executor yields between
    #    looks at the mirror while a task waits, for a host core (FREERIDE_ADMISSION=spin;
    #    its closed-gate second shows the CPU). [~10 s est.]
    probe $deadline measure_admission_spin 30 FREERIDE_LAUNCH_AT_OPEN=0 \
      FREERIDE_ADMISSION=spin probe_admission.py --trials 200 --json "$m/admission_spin.json"
    stand_in "$m/admission_spin.json" $? measure_admission_spin
    # 3. Harvest of open-gate time in bubbles queued ahead of the GPU (20 ms, and 0.5 ms:
    #    both >= 200 us), 8 and 1 hardware queues, single-phase Spin and a 30-phase
    #    ItemCounter with device phases (the default), then with them off and phases
    #    ahead off and on (the last four, where the budget leaves time): 10 workers, each
    #    in a fresh process (probes/probe_harvest_matrix.py; its own budget is what is
    #    left here, at most 150 s). [~61 s measured at cf361a5, ~20 s more est. for the two
    #    max_slices=16 runs added since]
    left=$((deadline - SECONDS - 10))
    [ $left -gt 150 ] && left=150
    [ $left -lt 0 ] && left=0
    probe $deadline measure_harvest 160 probe_harvest_matrix.py --budget $left \
      --json "$m/harvest.json"
    stand_in "$m/harvest.json" $? measure_harvest
    # 4. Other streams' kernels held by launches waiting at opens (G2's probe), 4 opens
    #    queued on T, the lookahead bound off and FREERIDE_MAX_LOOKAHEAD=1, both
    #    reserves. [~5 s each measured]
    for r in occupancy-cap green-context; do
      for la in none 1; do
        vars=()
        [ "$la" != none ] && vars=(FREERIDE_MAX_LOOKAHEAD=$la)
        probe $deadline "measure_channels_${r}_lookahead_$la" 20 ${vars[@]+"${vars[@]}"} \
          probe_channels.py $r --opens 4 --json "$m/channels_${r}_lookahead_${la}.json"
        stand_in "$m/channels_${r}_lookahead_${la}.json" $? "measure_channels_${r}_lookahead_$la"
      done
    done
    #    And in a green context with workqueues of its own (issue 36 item 2: kept only if
    #    it measures better), where the driver has them (CUDA 13.1); on an older one the
    #    row says why not. [~5 s est.]
    probe $deadline measure_channels_green_balanced 20 FREERIDE_GREEN_WORKQUEUE=balanced \
      probe_channels.py green-context --opens 4 \
      --json "$m/channels_green-context_workqueues_balanced.json"
    stand_in "$m/channels_green-context_workqueues_balanced.json" $? \
      measure_channels_green_balanced
    # 5. Item overhead of each built-in task against its plain kernel, and side-kernel
    #    bandwidth against a plain copy of Saxpy's bytes. [~14 s measured at cf361a5]
    budgeted $deadline measure_bench_items 60 $py -m freeride bench items --mode gpu \
      --out "$m/items.json"
    stand_in "$m/items.json" $? measure_bench_items
    table_of measure_bench_items "^ *(Saxpy|PageRank|GaussianBlur|Resize|copy)"
    # 6. The host cost per close+open pair as the metric is defined: the training
    #    thread's time in the hooks around a compute action, bubble record on
    #    (h.compute(), and attach() to a torch pipelining schedule), Python and C++ part
    #    on cuda:0; bench preempt's rows above add the launch an open enqueues. Through
    #    hook_cost.py: bench hooks' rows, the Python part alone (the stub), and each kind
    #    of CUDA call a pair makes timed alone (where the C++ part goes). [~25 s est.:
    #    32,000 h.compute() pairs, 600 attached steps, 36,000 calls; --quick with
    #    MEASURE_QUICK=1]
    measure_bench $deadline hooks 60 "^ *(backend|cuda) " benchmarks/hook_cost.py
    # 7. Training overhead (and the pipeline's harvest), under the default hardware
    #    queues and one, each in a fresh process: the full emulation (20 iterations a
    #    variant of 4 and 8 ms actions) [~95 s measured at 51c0fe7]; MEASURE_QUICK=1 runs
    #    5 iterations of the same actions (--iterations 5) [~40 s est.: the 1.1 s
    #    iterations of "stream priority only" under 8 queues are most of it], not
    #    --quick's 1 and 2 ms actions, where the same 16 closes an iteration weigh four
    #    times as much against its time (Spin 1.5% there at cf361a5, 0.3-0.45% for the
    #    others in the full run at 51c0fe7). Each row also says what a close cost, which
    #    carries over to other lengths. Listed NOT RUN where less than its estimate is
    #    left: a run its limit cuts short measures nothing and costs the machine's time.
    need=90
    [ "${MEASURE_QUICK:-0}" = 1 ] && need=40
    QUICK_ARGS="--iterations 5" BUDGET_NEED=$need measure_bench $deadline pipeline 130 \
      "^ *(baseline|freeride: (spin|saxpy|pagerank|blur)) "
    # 8. Where time is left: host-started admission with the executor polling. [~10 s est.]
    probe $deadline measure_admission_poll 30 FREERIDE_LAUNCH_AT_OPEN=0 FREERIDE_ADMISSION=poll \
      probe_admission.py --trials 200 --json "$m/admission_poll.json"
    stand_in "$m/admission_poll.json" $? measure_admission_poll
    # The table (no GPU; outside the budget): rows of what did not run say "not run".
    run measure_table 30 $py benchmarks/measure_table.py "$m" --out "$work/measure_table.md"
    if [ -f "$work/measure_table.md" ]; then
      cat "$work/measure_table.md" >>"$summary"
      cp "$work/measure_table.md" "$out/measure_table.md"
    fi
    pack
  )
fi

if step qualify; then
  deadline=$((SECONDS + ${QUALIFY_BUDGET:-480}))
  # In order of importance; [~N s] is the estimate on an H100/H200 when things pass (the
  # 2026-11-27 H200 runs' times where they ran them; a fresh Python with torch and CUDA
  # takes ~5 s), the number after the name the hard limit. First what the second
  # 2026-11-27 H200 run (at cf361a5) left open, items 1-5, ~295 s when things pass:
  # with QUALIFY_BUDGET=480 they run, and each benchmark of 6 only where its estimate is
  # left (BUDGET_NEED; the measure step runs both in full). Then what first ran and
  # passed in that run, then the rest of the list, all passed on 2026-11-27, where time
  # is left; listed NOT RUN otherwise. A hung item costs its limit, plus the watchdog's
  # stack dumps (py-spy: about a second a process) and 10 s.
  # 1. tests/test_hardware_queues.py hung at cf361a5 (one hardware queue, time_slice=None:
  #    a launch ran on through a close it never saw, and the next open's launch waited
  #    behind it with training's kernels behind that); fixed since: a launch never runs in
  #    two bubbles (freeride/slice.h, closed_since). Now a stuck training kernel fails the
  #    case after 5 s instead of hanging. 4 workers of ~10-12 s [~55 s].
  pytest_file $deadline 80 tests/test_hardware_queues.py -m gpu
  # 2. Harvest in queued bubbles, after the fix for blocks that left a launch while its
  #    close was pending whenever a read across the bus was slow (waits_for_refresh; at
  #    cf361a5 20 ms bubbles harvested 0.39-0.64): the queued-ahead harvest tests, the
  #    cancel and done tests, the handover with followers and withholding [~60 s]; then
  #    the probe's slice settings [~35 s].
  pytest_file $deadline 90 tests/test_launch_at_open.py -m gpu
  #    5 workers, at most 75 s: the default slice against 0.05 s and None (1.01 at
  #    cf361a5), and 1.5 ms bubbles.
  probe $deadline probe_queued_harvest 100 probe_queued_harvest.py
  # 3. G1's deadlock tests (a device synchronisation in a bubble whose close is not
  #    enqueued returns within 50 ms) and G4's bound, beside the new claim rule, with
  #    successors (FREERIDE_SUCCESSORS=1) and without [~25 s each, ~12 s].
  budgeted $deadline "test_slice_gpu_g1_successors" 60 env FREERIDE_SUCCESSORS=1 \
    $py -X faulthandler -m pytest -q -p no:cacheprovider tests/test_slice_gpu.py -m gpu -k g1
  pytest_file $deadline 60 tests/test_slice_gpu.py -m gpu -k g1
  pytest_file $deadline 40 tests/test_slice_gpu.py -m gpu -k g4
  # 4. The executor sleeps through compute (review G14's rest; its ring now compared with
  #    its control, not a fixed 300 us):
  #    while every open rings it looks at the mirror every 20 ms, not 1 ms (wake-ups
  #    counted, with the 1 ms look after opens on two streams and polling as controls),
  #    and a ring still admits within the bubble (90th percentile under 2 ms). [~12 s]
  pytest_file $deadline 40 tests/test_gpu.py -m gpu -k admission_sleeps
  #    memcheck over a small run of side kernels (RawKernel and built-ins, host and
  #    stream-ordered bubbles) [~12 s]. Its purpose here is memory errors, so API errors
  #    are not reported: a RawKernel's parameter count is asked of cuFuncGetParamInfo
  #    until it answers CUDA_ERROR_INVALID_VALUE (the documented way to find the last
  #    parameter), which memcheck counts as an error. On 2026-11-27 it counted 3 (exit 99)
  #    with every result right: two of those, and the batched gate write's trial of
  #    CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER, which the driver refused (no longer
  #    tried).
  if [ -x "$sanitizer" ]; then
    budgeted $deadline memcheck_small 45 "$sanitizer" --tool memcheck --report-api-errors no \
      --error-exitcode 99 $py -X faulthandler benchmarks/probes/memcheck_small.py
    results_of memcheck_small
  else
    note "memcheck_small                               NOT RUN (no compute-sanitizer)"
  fi
  # 5. Device phases, on by default since their tests passed at cf361a5 (issue 36 item
  #    1; FREERIDE_DEVICE_PHASES=0 turns them off), beside the claim rules that came
  #    after (a launch never runs in two bubbles, the shared answer's refresh wait): a
  #    30-phase ItemCounter in bubbles queued ahead with device phases, and with them off
  #    and phases ahead off and on (no item may start before the phase before completed,
  #    every item once; phases done in the bubbles printed) [~18 s measured]; a
  #    RawKernel's stencil across 61 phases against numpy in fewer launches than phases,
  #    every item once and in order under gate flips, and a kernel that uses
  #    for_each_item refused [~15 s]; PageRank against the host backend in fewer launches
  #    than phases [~10 s].
  pytest_file $deadline 110 tests/test_phases_ahead.py -m gpu -s
  pytest_file $deadline 40 tests/test_raw_kernel_gpu.py -m gpu -s -k device_phases
  pytest_file $deadline 30 tests/test_pagerank.py -m gpu -s -k device_phases
  # 5b. What has never run on a GPU and the measure step leans on, or no other item
  #    checks: FREERIDE_ADMISSION=spin admits a task submitted with the gate closed,
  #    exactly once, by a stream-ordered open [~8 s est.]; the green context with its own
  #    workqueues where the driver has them (CUDA 13.1; on r580 the fallback says why)
  #    [~6 s est.]; _C.measure_call_costs, whose rows the measure step's hooks item
  #    prints, and its release of a held stream when a call fails [~10 s est.]; an open
  #    the spinning executor sees take effect before its launch at the open is enqueued
  #    (a test switch delays it), under one hardware queue and time_slice=None: the
  #    open's launch left out, training's kernels not held [~10 s est.]; a task past the
  #    whole memory budget refused with no device memory taken [~5 s est.].
  pytest_file $deadline 30 tests/test_gate.py -m gpu -k "follows_the_environment and spin"
  pytest_file $deadline 40 tests/test_open_seen_first.py -m gpu
  pytest_file $deadline 30 tests/test_reserve_gpu.py -m gpu -k own_workqueues
  pytest_file $deadline 40 tests/test_bench.py -m gpu -k call_costs
  pytest_file $deadline 20 tests/test_memory_need.py -m gpu
  # 6. The pause and the training overhead, small (--quick: 50 pause trials; 3 pipeline
  #    iterations per variant, both hardware-queue settings), their JSON in the archive
  #    and their main rows in the summary. [~22 s, ~17 s measured at cf361a5]
  BUDGET_NEED=30 budgeted $deadline bench_preempt_quick 150 \
    $py -m freeride bench preempt --mode gpu \
    --quick --out "$work/preempt_quick.json"
  table_of bench_preempt_quick "^ *(no side work|freeride, gate|sliced grid)"
  BUDGET_NEED=25 budgeted $deadline bench_pipeline_quick 90 \
    $py -m freeride bench pipeline --mode gpu \
    --quick --out "$work/pipeline_quick.json"
  table_of bench_pipeline_quick "^ *(baseline|freeride: (spin|saxpy|blur)) "
  # What first ran on a GPU at cf361a5, and passed.
  # Phases ahead (off by default, FREERIDE_PHASES_AHEAD=1; issue 36, review G3; its
  #    queued-bubble cases ran in item 5): the multi-phase GPU tests with it on and device
  #    phases off, stream-ordered bubbles included [~10 s measured].
  budgeted $deadline "test_gpu_phases_ahead" 90 env FREERIDE_PHASES_AHEAD=1 FREERIDE_DEVICE_PHASES=0 \
    $py -X faulthandler -m pytest -q -p no:cacheprovider tests/test_gpu.py -m gpu \
    -k "exactly_once or fallback_without_stream_memops or image_tasks"
  # The watcher's launch (off by default, FREERIDE_WATCHER_LAUNCH=1; issue 36 item 1,
  #    G8): with launches at opens off, host-started bubbles run side
  #    items, most launched by the watcher's thread, every item once; and the control with
  #    it off. 2 workers. [~20 s est.]
  pytest_file $deadline 60 tests/test_watcher_launch.py -m gpu -s
  # G16: a report's clock origin from the clock anchor, within 2 ms
  # of the first open with 300 ms of training work queued behind it, under one hardware
  # queue (with the probe's fallback as the negative control) and the default. 2 workers.
  # [~15 s]
  pytest_file $deadline 40 tests/test_profiling.py -m gpu -k clock_origin
  # The launch shapes' cache (review G9; ANSWER yes at cf361a5): does the driver's
  # occupancy answer read a function's preferred carveout (the cache asks again after a
  # set either way)? CuPy and the driver only. [~5 s est.]
  probe $deadline probe_occupancy_carveout 20 probe_occupancy_carveout.py
  # The pause against its controls (answered at cf361a5: dfb32e6 fixed the ~7 ms; what is
  #    left is the host's round trip where the close is not queued ahead): 9 variants in
  #    fresh processes, each at most 25 s, the probe at most 105 s. [~25 s measured]
  probe $deadline probe_pause 130 probe_pause.py
  # The rest of the qualify list, all passed on 2026-11-27 (its times in brackets).
  # G7: close abandoning a launch queued in the green context; the normal close beside
  # unrelated GPU work. [~14 s]
  probe $deadline probe_abandon_green 30 probe_abandon_green.py
  # The cudaFree removal: exit with an open ahead of the GPU [~16 s], close with a task
  # waiting on a busy stream and the rest of the memory lifetime tests [~10 s].
  pytest_file $deadline 30 tests/test_gpu.py -m gpu -k process_exits
  pytest_file $deadline 30 tests/test_lifetime.py -m gpu
  # G2: does a launch queued at an open hold other streams' hardware queues? Both
  # reserves, launches at opens on and off. [~4 x 5 s]
  for r in occupancy-cap green-context; do
    for v in 1 0; do
      probe $deadline "probe_channels_${r}_at_open_$v" 15 \
        FREERIDE_LAUNCH_AT_OPEN=$v probe_channels.py $r
    done
  done
  # Q3: does creating a stream wait for side kernels, and for a bubble whose close is
  # enqueued? [~2 x 6 s]
  for r in occupancy-cap green-context; do
    probe $deadline "probe_stream_create_$r" 20 probe_stream_create.py $r
  done
  # G8: the admission delay, executor's path (ring, spin, poll), the watcher's launch and
  # at opens. [~5 x 7 s]
  probe $deadline probe_admission_ring 20 FREERIDE_LAUNCH_AT_OPEN=0 probe_admission.py
  probe $deadline probe_admission_spin 20 FREERIDE_LAUNCH_AT_OPEN=0 FREERIDE_ADMISSION=spin \
    probe_admission.py
  probe $deadline probe_admission_watcher 20 FREERIDE_LAUNCH_AT_OPEN=0 \
    FREERIDE_WATCHER_LAUNCH=1 probe_admission.py
  probe $deadline probe_admission_poll 20 FREERIDE_LAUNCH_AT_OPEN=0 FREERIDE_ADMISSION=poll \
    probe_admission.py
  probe $deadline probe_admission_at_open 20 probe_admission.py
  # The lifetime fixes: held slabs, an abandoned launch queued in the green context and
  # reclaimed once passed (G5, G7). 4 workers. [~25 s]
  pytest_file $deadline 45 tests/test_abandon_gpu.py -m gpu
  # G18: the green context's blocks stay on its SMs (and the fallback where they would
  # not; its own workqueues ran in item 5b), and PTX the driver cannot JIT named
  # (forced). [~3 x 6 s]
  pytest_file $deadline 40 tests/test_reserve_gpu.py -m gpu \
    -k "stay_on_its_sms or outside_the_green_context"
  pytest_file $deadline 30 tests/test_drivers_gpu.py -m gpu -k cannot_jit
  # F12's launch drawn where its first block began [~5 s].
  pytest_file $deadline 30 tests/test_gpu.py -m gpu -k first_block
  # G15(c): does mem_get_info on another thread invalidate a global-mode capture? [~8 s]
  probe $deadline probe_mem_get_info_capture 30 probe_mem_get_info_capture.py
  # Captures beside side work, job threads, bubble_stats, free-memory samples and
  # backends being made; the negative control. [~24 s]
  pytest_file $deadline 60 tests/test_capture.py -m gpu
  # What remains of the GPU basics. [~10 s]
  pytest_file $deadline 40 tests/test_gpu.py -m gpu \
    -k "not process_exits and not first_block and not admission_sleeps"
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
  # The hooks' cost per close+open pair on cuda:0 (Python and C++), with the stub's rows
  # (the Python part alone) beside it for comparison with CPU machines' figures, and each
  # kind of CUDA call a pair makes timed alone.
  budgeted $deadline bench_hooks 60 $py benchmarks/hook_cost.py --mode gpu --out "$work/hooks.json"
fi

note "total ${SECONDS}s (started at ${start}s)"
pack
