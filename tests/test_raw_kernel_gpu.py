"""fr.tasks.RawKernel on a GPU (with CuPy; every test marked gpu, the host tests are in
test_raw_kernel.py): kernels compiled by CuPy and run by the executor match torch and
numpy, the driver's parameter sizes are those the packing rule assumes, every item runs
once across phases under gate flips, compile errors and bad arguments leave the harvester
usable, the compile cache and memory accounting, a kernel that skips the item loop fails
instead of looping while paused launches of a correct one go on, the example script runs,
a faulting kernel fails its task and poisons only its process, and submit() follows CuPy's
current stream."""

import contextlib
import os
import sys
import threading
import time

import numpy as np
import pytest
from gpu_worker import finishes_within
from nvrtc import SCALE
from test_raw_kernel import EXAMPLE, ROOT

import freeride as fr
from conftest import wait_until
from freeride.tasks._signature import CTX_BYTES

# ---- On a GPU (with CuPy): the same kernels compiled by CuPy and run by the executor ----

COUNT = r"""
#include <freeride/preempt.cuh>
// counts[phase * items + item] += 1, and a violation for an item that starts before the
// previous phase finished.
extern "C" __global__ void count(fr_item_ctx ctx, unsigned int* counts,
                                 unsigned long long* phase_done, unsigned int* violations,
                                 unsigned long long ns) {
  freeride::for_each_item(ctx, [&](unsigned long long item) {
    if (threadIdx.x == 0) {
      if (ctx.phase > 0 && phase_done[ctx.phase - 1] != ctx.n_items) atomicAdd(violations, 1u);
      unsigned long long t0;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      for (unsigned long long t = t0; t - t0 < ns;) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      atomicAdd(&counts[ctx.phase * ctx.n_items + item], 1u);
      __threadfence();
      atomicAdd(&phase_done[ctx.phase], 1ull);
    }
  });
}
"""


@pytest.fixture
def gpu():
    pytest.importorskip("cupy", reason="RawKernel needs CuPy (pip install 'freeride[cupy]')")
    torch = pytest.importorskip("torch")
    with fr.Harvester("cuda:0", memory_budget="1GiB") as h:
        yield h, torch


@pytest.fixture
def gpu_no_slice():
    """A harvester without a time slice: a launch ends only when its phase completes or
    the gate closes, so launches beyond one per phase count the pauses."""
    pytest.importorskip("cupy", reason="RawKernel needs CuPy (pip install 'freeride[cupy]')")
    torch = pytest.importorskip("torch")
    with fr.Harvester("cuda:0", memory_budget="1GiB", time_slice=None) as h:
        yield h, torch


@contextlib.contextmanager
def _gate_flips(h):
    """The gate opened for 0.7 ms and closed for 0.3 ms, over and over, from another
    thread (from the host), until the block ends."""
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            h.gate.open(stream="host")
            time.sleep(0.0007)
            h.gate.close(stream="host")
            time.sleep(0.0003)

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        yield
    finally:
        stop.set()
        flipper.join()


def _count_buffers(torch, items, phases):
    # The kernel takes unsigned pointers: views give the tensors the dtypes it names.
    counts = torch.zeros(items * phases, dtype=torch.int32, device="cuda").view(torch.uint32)
    done = torch.zeros(phases, dtype=torch.int64, device="cuda").view(torch.uint64)
    violations = torch.zeros(1, dtype=torch.int32, device="cuda").view(torch.uint32)
    return counts, done, violations


@pytest.mark.gpu
def test_gpu_scale_matches_torch(gpu):
    h, torch = gpu
    n = 1_000_003
    x = torch.randn(n, device="cuda")
    expected = x * 2.5
    h.gate.open()
    handle = h.submit(fr.tasks.RawKernel(SCALE, "scale", (n + 255) // 256, (x, 2.5, n)))
    assert handle.result(timeout=60)[0] is x
    torch.cuda.synchronize()
    assert torch.equal(x, expected)


@pytest.mark.gpu
def test_gpu_driver_reports_the_parameter_sizes_and_numpy_scalars_run(gpu):
    """The driver's sizes (cuFuncGetParamInfo) are those the rule packs for: the context
    first, then pointer, float, unsigned long long. numpy scalars give the same result
    as plain numbers."""
    h, torch = gpu
    k = fr.tasks.RawKernel(SCALE, "scale", 1, (None, 2.0, 0))
    info = fr._C.function_info(k.compile()["scale"])
    assert info["param_sizes"] == [CTX_BYTES, 8, 4, 8], info
    h.gate.open()
    x = torch.ones(1000, device="cuda")
    h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (x, np.float32(2.5), np.uint64(1000)))).result(
        60
    )
    h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (x, 2.0, 1000))).result(60)
    torch.cuda.synchronize()
    assert torch.all(x == 5.0)


@pytest.mark.gpu
def test_gpu_exactly_once_across_phases_under_gate_flips(gpu_no_slice):
    """Every item once across phases under flips from another thread. No time slice, so
    launches beyond the phases are flips that paused one. Negative control: the same
    kernel without flips runs in one launch per phase."""
    h, torch = gpu_no_slice
    items, phases = 20_000, 3  # 100 us items: each phase spans several gate flips
    quiet_buffers = _count_buffers(torch, items, phases)
    quiet = h.submit(
        fr.tasks.RawKernel(COUNT, "count", items, (*quiet_buffers, 100_000), phases=phases)
    )
    quiet.result(timeout=120)
    assert torch.all(quiet_buffers[0].view(torch.int32) == 1)
    assert quiet.launches <= phases + 1, f"{quiet.launches} launches without flips or slices"
    counts, done, violations = _count_buffers(torch, items, phases)
    k = fr.tasks.RawKernel(
        COUNT, "count", items, (counts, done, violations, 100_000), phases=phases
    )
    with _gate_flips(h):
        handle = h.submit(k)
        assert handle.wait(120)
    handle.result()
    print(f"launches: {quiet.launches} without flips, {handle.launches} with")
    assert handle.launches > quiet.launches, "no launch was paused by a flip"
    assert torch.all(counts.view(torch.int32) == 1)
    assert int(violations.view(torch.int32)[0]) == 0


def _heat_matches_numpy(h, torch, steps, **kwargs):
    """The example's heat stencil (each item reads neighbours that other blocks wrote in
    the phase before) over `steps` phases, against numpy; the task's handle."""
    n = 100_000
    u0 = torch.zeros(n, device="cuda")
    u0[n // 2 - 50 : n // 2 + 50] = 100.0
    initial = u0.cpu().numpy()
    u1 = torch.empty_like(u0)
    h.gate.open()
    tiles = (n + 255) // 256
    k = fr.tasks.RawKernel(
        EXAMPLE.read_text(), "heat_step", tiles, (u0, u1, 0.25, n), phases=steps, **kwargs
    )
    handle = h.submit(k)
    handle.result(60)
    ref = initial.copy()
    for _ in range(steps):
        nxt = ref.copy()
        nxt[1:-1] = ref[1:-1] + np.float32(0.25) * (ref[:-2] - 2 * ref[1:-1] + ref[2:])
        ref = nxt
    out = (u1 if steps % 2 else u0).cpu().numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
    return handle


@pytest.mark.gpu
def test_gpu_example_kernels_match_numpy(gpu):
    h, torch = gpu
    _heat_matches_numpy(h, torch, 31)


@pytest.mark.gpu
def test_gpu_compile_errors_and_bad_arguments_leave_the_harvester_usable(gpu):
    h, torch = gpu
    broken = SCALE.replace("x[i] *= a", "x[i] *= b")
    with pytest.raises(fr.KernelCompileError) as info:
        h.submit(fr.tasks.RawKernel(broken, "scale", 4, (None, 2.0, 10)))
    assert "undefined" in info.value.log
    not_c = SCALE.replace('extern "C" ', "")
    with pytest.raises(fr.KernelCompileError, match='extern "C"'):
        h.submit(fr.tasks.RawKernel(not_c, "scale", 4, (None, 2.0, 10)))
    # Count and sizes, from the driver (cuFuncGetParamInfo), at submit.
    x = torch.zeros(10, device="cuda")
    with pytest.raises(TypeError, match=r"kernel 'scale' takes 3 argument\(s\) after fr_item"):
        h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (x, 2.0)))
    with pytest.raises(TypeError, match=r"args\[1\] of kernel 'scale' .* float64 scalar"):
        h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (x, np.float64(2.0), 10)))
    with pytest.raises(TypeError, match=r"args\[1\] of kernel 'scale' is a 4-byte .* array"):
        h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (x, x, 10)))
    no_ctx = (
        SCALE.replace("fr_item_ctx ctx, ", "")
        .replace(
            "freeride::for_each_item(ctx, [&](unsigned long long item) {",
            "{ unsigned long long item = 0;",
        )
        .replace("});", "}")
    )
    with pytest.raises(TypeError, match="first parameter of kernel 'scale' must be `fr_item_ctx"):
        h.submit(fr.tasks.RawKernel(no_ctx, "scale", 4, (x, 2.0, 10)))
    with pytest.raises(ValueError, match="must be on cuda:0"):
        h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (torch.zeros(10), 2.0, 10)))
    bounded = SCALE.replace("__global__ void", "__global__ void __launch_bounds__(64)")
    with pytest.raises(ValueError, match="exceeds what kernel 'scale' can run with"):
        h.submit(fr.tasks.RawKernel(bounded, "scale", 4, (None, 2.0, 10), block=128))
    with pytest.raises(fr.MemoryBudgetError):
        big = torch.zeros(300 * 2**20, dtype=torch.float32, device="cuda")  # 1.2 GiB > budget
        h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (big, 2.0, 10))).result(10)
    del big
    h.gate.open()
    x = torch.ones(10, device="cuda")
    h.submit(fr.tasks.RawKernel(SCALE, "scale", 1, (x, 3.0, 10))).result(60)
    assert torch.all(x == 3.0)


@pytest.mark.gpu
def test_gpu_compile_cache_and_memory_accounting(gpu):
    h, torch = gpu
    source = SCALE.replace("*= a", "*= a * 1.0f")  # a module no other test compiled
    before = fr.tasks.RawKernel.cache_info()
    x = torch.ones(1 << 20, device="cuda")
    k = fr.tasks.RawKernel(source, "scale", 4096, (x, 1.0, 1 << 20))
    functions = k.compile()
    assert fr.tasks.RawKernel.cache_info().misses == before.misses + 1
    again = fr.tasks.RawKernel(source, "scale", 4096, (x, 1.0, 1 << 20))
    assert again.compile() == functions
    assert fr.tasks.RawKernel.cache_info().hits >= before.hits + 1
    # With the gate closed the task is admitted, holding its memory, and cannot finish
    # (and give the memory back) before the poll sees it.
    h.gate.close(stream="host")
    handle = h.submit(again)
    wait_until(lambda: h.memory_used == x.numel() * 4)
    assert not handle.done()
    h.gate.open(stream="host")
    handle.result(timeout=60)
    wait_until(lambda: h.memory_used == 0)


SKIPS_THE_LOOP = r"""
#include <freeride/preempt.cuh>
// Phase 0 runs the item loop; phase 1 returns before it (a kernel bug): its launches
// would end with nothing done and nobody held back by the gate, forever.
extern "C" __global__ void lazy(fr_item_ctx ctx, unsigned int* touched) {
  if (ctx.phase == 1) {
    if (threadIdx.x == 0) atomicAdd(touched, 1u);
    return;
  }
  freeride::for_each_item(ctx, [&](unsigned long long) {});
}
"""


@pytest.mark.gpu
def test_gpu_kernel_that_skips_the_item_loop_fails_instead_of_looping(gpu):
    h, torch = gpu
    touched = torch.zeros(1, dtype=torch.int32, device="cuda").view(torch.uint32)
    h.gate.open()
    handle = h.submit(fr.tasks.RawKernel(SKIPS_THE_LOOP, "lazy", 1000, (touched,), phases=2))
    assert handle.wait(timeout=60), "the broken kernel was relaunched instead of failing"
    with pytest.raises(fr.TaskFailedError, match="must call freeride::for_each_item"):
        handle.result()
    assert handle.launches == 2  # phase 0 once, phase 1 once: never relaunched
    assert handle.items_done == 1000
    # The harvester goes on: a correct kernel runs after it.
    x = torch.ones(10, device="cuda")
    h.submit(fr.tasks.RawKernel(SCALE, "scale", 1, (x, 3.0, 10))).result(60)
    assert torch.all(x == 3.0)


SOME_BLOCKS_SKIP = r"""
#include <freeride/preempt.cuh>
// Blocks past the fourth return before the item loop (ordinary CUDA style, a bug here):
// the launch's last block never counts itself out, so no end record is written.
extern "C" __global__ void partial(fr_item_ctx ctx, unsigned int* touched) {
  if (blockIdx.x >= 4) return;
  freeride::for_each_item(ctx, [&](unsigned long long) {
    if (threadIdx.x == 0) atomicAdd(touched, 1u);
  });
}
"""


@pytest.mark.gpu
def test_gpu_kernel_where_some_blocks_skip_the_item_loop_fails_within_seconds(gpu):
    """Review F3: a launch whose blocks partly skip for_each_item ended without its end
    record and left the launch's counters behind, and every later launch of the phase
    then found its slice already over and ran nothing, about one in G/k launches doing
    work, 10 ms apart: wait() all but hung and the task never failed. Each launch has its
    own counters now, and a launch without its end record fails the task."""
    h, torch = gpu
    touched = torch.zeros(1, dtype=torch.int32, device="cuda").view(torch.uint32)
    h.gate.open()
    began = time.monotonic()
    handle = h.submit(fr.tasks.RawKernel(SOME_BLOCKS_SKIP, "partial", 10**7, (touched,), grid=64))
    assert handle.wait(timeout=30), "the broken kernel kept being relaunched"
    assert time.monotonic() - began < 10
    with pytest.raises(fr.TaskFailedError, match="for_each_item"):
        handle.result()


STUCK = r"""
#include <freeride/preempt.cuh>
// An item that never returns until the host sets *flag (mapped pinned memory).
extern "C" __global__ void stuck(fr_item_ctx ctx, const volatile unsigned int* flag,
                                 unsigned int* started) {
  freeride::for_each_item(ctx, [&](unsigned long long) {
    if (threadIdx.x == 0) {
      atomicAdd(started, 1u);
      while (*flag == 0u) {
      }
    }
  });
}
"""


def _stuck_task(torch):
    flag = torch.zeros(1, dtype=torch.int32, pin_memory=True)  # UVA: the kernel reads it
    started = torch.zeros(1, dtype=torch.int32, device="cuda").view(torch.uint32)
    task = fr.tasks.RawKernel(STUCK, "stuck", 1, (np.uint64(flag.data_ptr()), started), grid=1)
    return task, flag, started


@pytest.mark.gpu
@pytest.mark.parametrize("release_first", [False, True], ids=["stuck", "released"])
def test_gpu_close_abandons_an_item_that_never_returns(release_first):
    """Review F9: with no time slice, a side item that never returns held close (and the
    interpreter's exit) for good. close() now waits CLOSE_DEADLINE_S, then abandons the
    launch: the task is cancelled, its memory kept, a RuntimeWarning says so, and close
    returns. Negative control (released): the item returns before close, which then
    returns at once without a warning."""
    pytest.importorskip("cupy", reason="RawKernel needs CuPy (pip install 'freeride[cupy]')")
    torch = pytest.importorskip("torch")
    from freeride._closing import CLOSE_DEADLINE_S

    h = fr.Harvester("cuda:0", time_slice=None)
    task, flag, started = _stuck_task(torch)
    h.gate.open(stream="host")
    handle = h.submit(task)
    wait_until(lambda: int(started.item()) > 0, timeout=30)
    if release_first:
        flag[0] = 1
        assert handle.wait(30)
    began = time.monotonic()
    try:
        if release_first:
            h.close()
        else:
            with pytest.warns(RuntimeWarning, match="abandoned"):
                finishes_within(CLOSE_DEADLINE_S + 10, h.close, "close() with a stuck item")
        took = time.monotonic() - began
    finally:
        flag[0] = 1  # the kernel ends: the device is free for the next test
        torch.cuda.synchronize()
    print(f"close took {took:.3f} s (deadline {CLOSE_DEADLINE_S} s)")
    if release_first:
        assert took < 1.0 and handle.state == "done"
    else:
        assert CLOSE_DEADLINE_S - 0.5 < took < CLOSE_DEADLINE_S + 2.0
        assert handle.state == "cancelled"


@pytest.mark.gpu
def test_gpu_paused_launches_of_a_correct_kernel_are_not_taken_for_a_broken_one(gpu_no_slice):
    """Launches cut short by the gate end with the phase unfinished too; they must go on.
    No time slice, so only the gate cuts the phase. Negative control: without flips the
    phase runs in one launch, which the flipped run must clearly exceed."""
    h, torch = gpu_no_slice
    # Sized to the device: 3200 items of 50 us per SM, on at most 8 blocks of 256 threads
    # per SM, take at least 20 ms of open gate, so the 20 flips below (one per 3 ms) cut
    # the phase many times on any GPU.
    items = fr.backend_info()["devices"][0]["sm_count"] * 8 * 400
    h.gate.open()
    quiet_buffers = _count_buffers(torch, items, 1)
    quiet = h.submit(fr.tasks.RawKernel(COUNT, "count", items, (*quiet_buffers, 50_000)))
    quiet.result(timeout=120)
    assert quiet.launches <= 2, f"{quiet.launches} launches without flips or slices"
    counts, done, violations = _count_buffers(torch, items, 1)
    handle = h.submit(fr.tasks.RawKernel(COUNT, "count", items, (counts, done, violations, 50_000)))
    for _ in range(20):
        time.sleep(0.002)
        h.gate.close(stream="host")
        time.sleep(0.001)
        h.gate.open(stream="host")
    handle.result(timeout=120)
    print(f"launches: {quiet.launches} without flips, {handle.launches} with 20 flips")
    assert handle.launches > quiet.launches + 3, (
        f"{handle.launches} launches with flips against {quiet.launches} without: the phase "
        "was hardly cut"
    )
    assert torch.all(counts.view(torch.int32) == 1)


@pytest.mark.gpu
def test_gpu_example_script_runs():
    """examples/raw_kernel.py end to end: both tasks in the bubbles of a stand-in loop,
    checked against torch and numpy by the script itself."""
    pytest.importorskip("cupy", reason="the example needs CuPy")
    import subprocess

    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "raw_kernel.py")],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "both results match" in proc.stdout


FAULTS = r"""
#include <freeride/preempt.cuh>
extern "C" __global__ void wild(fr_item_ctx ctx, float* p) {
  freeride::for_each_item(ctx, [&](unsigned long long) {
    if (threadIdx.x == 0) p[0] = 1.0f;  // p is a null pointer: an illegal address
  });
}
"""

_FAULT_CHILD = f"""
import sys, torch, freeride as fr
source = {FAULTS!r}
with fr.Harvester("cuda:0") as h:
    h.gate.open()
    t = h.submit(fr.tasks.RawKernel(source, "wild", 4, (None,)))
    t.wait(60)
    print("state", t.state)
    try:
        t.result()
    except fr.TaskFailedError as e:
        print("error", e)
    try:
        torch.ones(4, device="cuda").sum().item()
        print("context usable")
    except Exception as e:
        print("context unusable:", type(e).__name__)
"""


@pytest.mark.gpu
def test_gpu_faulting_kernel_fails_its_task_and_poisons_only_its_process():
    """What docs/guide.md says is true: an illegal address fails the task with CUDA's error
    (no crash), and the CUDA context of that process is then unusable, training included.
    Which is why untrusted kernels are tried in a separate process first."""
    pytest.importorskip("cupy", reason="RawKernel needs CuPy")
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", _FAULT_CHILD],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1), out[-3000:]  # an exception at exit, never a signal
    assert "state failed" in proc.stdout, out[-3000:]
    assert "illegal" in proc.stdout.lower(), out[-3000:]
    assert "context unusable" in proc.stdout, out[-3000:]


_PRODUCE = r"""
extern "C" __global__ void produce(float* x, unsigned long long n, unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += gridDim.x * blockDim.x) {
    x[i] = 1.0f;
  }
}
"""


@pytest.mark.gpu
@pytest.mark.parametrize("current", [True, False], ids=["current-stream", "other-stream"])
def test_submit_follows_cupys_current_stream_on_a_gpu(gpu, current):
    """Issue 20 item 3: CuPy inputs produced on CuPy's current stream (not torch's) are
    complete before the side task reads them. A producer kernel spins 50 ms, then writes
    x = 1; Saxpy (y += 2 x) submitted right after must see every 1. Negative control
    (other-stream): the same producer on a CuPy stream that is not current when
    submit() is called, which freeride cannot know about: Saxpy then runs during the
    producer's 50 ms spin and reads zeros, so y is not all 2 (proving the check can
    fail)."""
    cupy = pytest.importorskip("cupy")
    h, _ = gpu
    n = 1 << 20
    x = cupy.zeros(n, dtype=cupy.float32)
    y = cupy.zeros(n, dtype=cupy.float32)
    cupy.cuda.runtime.deviceSynchronize()
    produce = cupy.RawKernel(_PRODUCE, "produce")
    producer = cupy.cuda.Stream(non_blocking=True)
    with producer:
        produce((64,), (256,), (x, cupy.uint64(n), cupy.uint64(50_000_000)))
    if current:
        with producer:
            task = h.submit(fr.tasks.Saxpy(2.0, x, y))
    else:
        task = h.submit(fr.tasks.Saxpy(2.0, x, y))
    assert task.wait(timeout=30)
    producer.synchronize()
    low = float(y.min())
    if current:
        assert low == 2.0, (
            f"Saxpy read inputs before the producer on CuPy's stream wrote them: {low}"
        )
    else:
        assert low == 0.0, (
            f"negative control: Saxpy should have overtaken the producer, y.min()={low}"
        )


# ---- Device phases (FREERIDE_DEVICE_PHASES=1, csrc/device_phases.hpp) ----

COUNT_PHASES = r"""
#include <freeride/preempt.cuh>
// COUNT's checks with the phase from for_each_phase_item: counts[phase * items + item] += 1,
// and a violation for an item that starts before the previous phase finished (with device
// phases, other blocks of the same launch may have run that phase).
extern "C" __global__ void count_phases(fr_item_ctx ctx, unsigned int* counts,
                                        unsigned long long* phase_done,
                                        unsigned int* violations, unsigned long long items,
                                        unsigned long long ns) {
  freeride::for_each_phase_item(ctx, [&](unsigned long long phase, unsigned long long item) {
    if (threadIdx.x == 0) {
      if (phase > 0 && *(volatile unsigned long long*)&phase_done[phase - 1] != items) {
        atomicAdd(violations, 1u);
      }
      unsigned long long t0;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      for (unsigned long long t = t0; t - t0 < ns;) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      atomicAdd(&counts[phase * items + item], 1u);
      __threadfence();
      atomicAdd(&phase_done[phase], 1ull);
    }
  });
}
"""


@pytest.fixture
def gpu_device_phases(monkeypatch):
    """A harvester whose backend serves every phase of a task that can from one launch
    (read as the backend is made)."""
    pytest.importorskip("cupy", reason="RawKernel needs CuPy (pip install 'freeride[cupy]')")
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("FREERIDE_DEVICE_PHASES", "1")
    with fr.Harvester("cuda:0", memory_budget="1GiB") as h:
        yield h, torch


@pytest.mark.gpu
def test_gpu_device_phases_heat_matches_numpy_in_fewer_launches_than_phases(gpu_device_phases):
    """The example's heat stencil (each item reads neighbours that other blocks wrote in
    the phase before) as one phase of every phase's items: the result matches numpy, so
    the kernel kept the phases in order and their results visible across blocks, and it
    took fewer launches than phases (a launch went on from phase to phase on the GPU)."""
    h, torch = gpu_device_phases
    steps = 61
    handle = _heat_matches_numpy(h, torch, steps, device_phases=True)
    print(f"{steps} phases in {handle.launches} launches")
    assert handle.launches < steps


@pytest.mark.gpu
def test_gpu_device_phases_exactly_once_in_order_under_gate_flips(gpu_device_phases):
    """Every item once and no item of a phase before the phase before completed, with the
    gate flipped from another thread so that launches pause mid-phase and resume in
    another phase; and fewer launches than phases (about 0.2 ms a phase on an H100 or
    H200 under the occupancy cap, so each open window of 0.7 ms holds several: one launch
    a phase at least without device phases)."""
    h, torch = gpu_device_phases
    items, phases = 2_000, 20  # 50 us items on ~500 resident blocks: ~0.2 ms a phase
    counts, done, violations = _count_buffers(torch, items, phases)
    k = fr.tasks.RawKernel(
        COUNT_PHASES,
        "count_phases",
        items,
        (counts, done, violations, items, 50_000),
        phases=phases,
        device_phases=True,
    )
    with _gate_flips(h):
        handle = h.submit(k)
        assert handle.wait(120)
    handle.result()
    torch.cuda.synchronize()
    print(f"{phases} phases in {handle.launches} launches under flips")
    assert torch.all(counts.view(torch.int32) == 1)
    assert int(violations.view(torch.int32)[0]) == 0
    assert torch.all(done.view(torch.int64) == items)
    assert handle.launches < phases


@pytest.mark.gpu
def test_gpu_device_phases_refuse_a_kernel_that_uses_for_each_item(gpu_device_phases):
    """device_phases=True with a kernel that calls for_each_item (its body would take later
    phases' items for ctx.phase's): no item runs, and the task fails saying what to use.
    The same kernel without device_phases runs."""
    h, torch = gpu_device_phases
    x = torch.ones(1000, device="cuda")
    h.gate.open()
    wrong = fr.tasks.RawKernel(SCALE, "scale", 4, (x, 2.0, 1000), phases=2, device_phases=True)
    handle = h.submit(wrong)
    assert handle.wait(60), "the refused launches were relaunched instead of failing"
    with pytest.raises(fr.TaskFailedError, match="for_each_phase_item"):
        handle.result()
    torch.cuda.synchronize()
    assert torch.all(x == 1.0), "an item ran"
    h.submit(fr.tasks.RawKernel(SCALE, "scale", 4, (x, 2.0, 1000), phases=2)).result(60)
    torch.cuda.synchronize()
    assert torch.all(x == 4.0)
