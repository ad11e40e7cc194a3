"""The reserve side kernels leave free on every SM, and the time slice of every launch:
the GPU tests (all marked gpu; the host tests are in test_reserve.py).

They check what the reserve and the slice are for: a kernel that training launches while a
persistent side grid runs starts at once (and, the control, does not without a reserve), a
receive-style wait kernel on the training stream cannot deadlock against any side task
(every built-in task and a RawKernel, under the occupancy cap and in a green context),
device-wide synchronisations (synchronize, cudaFree) with the gate open wait at most about
a slice, training on a priority stream starts ahead of side work, side work in a green
context runs every item exactly once beside a RawKernel, backend_info reports the green
context, and launches in it stay on its SMs (checked when a harvester is made, with a
switch that makes the check see an SM too many).
"""

import re
import threading
import time

import numpy as np
import pytest
from gpu_worker import finishes_within, run_worker
from test_reserve import GREEN

import freeride as fr
from conftest import wait_until
from freeride import _C
from freeride.cli.bench import DEVICE_CLOCK_SRC

# -- on a GPU -------------------------------------------------------------------------------
#
# The reserve tests run without a time slice (time_slice=None): a side launch then holds its
# SMs until the gate closes, so nothing but the reserve lets training's kernels start while
# it runs. With the default 2 ms slice they would start at the first slice end anyway.

# mark: holds its stream for `ns` (so that the host has enqueued what follows before the GPU
# gets there), then stamps the time. probe: a kernel of the shape the default reserve keeps
# room for, 32 blocks of 512 threads with 48 KiB of dynamic shared memory, each stamping when
# it started. The same clock on every SM, so the stamps compare.
_STAMPS = (
    DEVICE_CLOCK_SRC
    + r"""
extern "C" __global__ void mark(unsigned long long ns, unsigned long long* at) {
  const unsigned long long t0 = now();
  while (now() - t0 < ns) {}
  *at = now();
}
extern "C" __global__ void probe(unsigned long long* started) {
  extern __shared__ unsigned char scratch[];
  scratch[threadIdx.x] = 1;
  __syncthreads();
  if (threadIdx.x == 0) started[blockIdx.x] = now() + scratch[0] - 1;
}
"""
)
PROBE_BLOCKS, PROBE_THREADS, PROBE_SHARED = 32, 512, 48 * 1024
HOLD_NS = 50_000_000
# A quarter of the default slice: a start beside the side grid, not a wait for its launch
# to end.
START_BOUND_NS = 500_000

# A receive: spins on a device flag until a later kernel on another stream sets it.
_RECV_SEND = r"""
extern "C" __global__ void recv(volatile unsigned int* flag) {
  while (*flag == 0u) {}
}
extern "C" __global__ void send(unsigned int* flag) { atomicExch(flag, 1u); }
"""

# A RawKernel side task whose items each spin `ns` nanoseconds.
_RAW_SPIN = r"""
#include <freeride/preempt.cuh>
extern "C" __global__ void spin(fr_item_ctx ctx, unsigned long long ns) {
  freeride::for_each_item(ctx, [&](unsigned long long) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
  });
}
"""

SIDE_TASKS = ["Spin", "ItemCounter", "Saxpy", "PageRank", "GaussianBlur", "Resize", "RawKernel"]


def _torch_cupy():
    torch = pytest.importorskip("torch")
    cp = pytest.importorskip("cupy")
    return torch, cp


CAP = fr.Reserve(mechanism="occupancy-cap")
RESERVES = [pytest.param(CAP, id="occupancy-cap"), pytest.param(GREEN, id="green-context")]


def _harvester(reserve, **kwargs):
    """A CUDA harvester with `reserve`. Green-context where the driver has none skips
    (the fallback is the occupancy cap, which the other parameter tests); where it has
    them, falling back fails the test."""
    h = fr.Harvester("cuda:0", reserve=reserve, **kwargs)
    if reserve.mechanism == "green-context" and h.reserve_fallback is not None:
        fallback = h.reserve_fallback
        h.close()
        if not fr.backend_info()["devices"][0]["green_contexts"]:
            pytest.skip(f"no green contexts in this driver: {fallback}")
        pytest.fail(f"the driver has green contexts, yet the harvester fell back: {fallback}")
    return h


def _spin_forever(h):
    """A Spin task long enough to hold the GPU for the whole test (cancelled after)."""
    t = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=20_000))
    wait_until(lambda: t.items_done > 0, timeout=30)  # its kernel runs
    time.sleep(0.05)  # every block of the persistent grid is up
    return t


class _Probe:
    """mark, then probe, on a stream of their own between two events. Everything is made
    and loaded here, before any side grid runs: a kernel loaded lazily at its first launch,
    or an allocation, may wait for the whole device."""

    def __init__(self, cp):
        module = cp.RawModule(code=_STAMPS)
        self._mark = module.get_function("mark")
        self._probe = module.get_function("probe")
        self._probe.max_dynamic_shared_size_bytes = PROBE_SHARED
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.marked = cp.zeros(1, dtype=cp.uint64)
        self.started = cp.zeros(PROBE_BLOCKS, dtype=cp.uint64)
        self.before, self.after = cp.cuda.Event(), cp.cuda.Event()
        cp.cuda.Device().synchronize()  # the zeroing is done: the stream does not wait for it
        self.enqueue_s = 0.0

    def enqueue(self) -> float:
        """Enqueues both kernels; returns the host time just before the first event."""
        begin = time.monotonic()
        with self.stream:
            self.before.record()
            self._mark((1,), (1,), (np.uint64(HOLD_NS), self.marked))
            self._probe((PROBE_BLOCKS,), (PROBE_THREADS,), (self.started,), shared_mem=PROBE_SHARED)
            self.after.record()
        self.enqueue_s = time.monotonic() - begin
        return begin

    def ran(self, timeout: float) -> bool:
        """True once the GPU has passed the probe; False after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not self.after.done:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def start_delay_ns(self) -> int:
        """From the end of the mark to the start of the probe's first block."""
        return int(self.started.get().min()) - int(self.marked.get()[0])


@pytest.mark.gpu
@pytest.mark.parametrize("reserve", RESERVES)
def test_training_kernel_starts_while_side_grid_runs(reserve):
    _, cp = _torch_cupy()
    probe = _Probe(cp)
    with _harvester(reserve, time_slice=None) as h:
        t = _spin_forever(h)
        try:
            launches = t.launches
            probe.enqueue()
            ran = probe.ran(timeout=1.0)
            # The launch that was running before the probe still is: the probe ran beside it.
            held = t.launches == launches and not t.done()
        finally:
            t.cancel()  # lets a probe that found no room start, so the stream drains
        probe.stream.synchronize()
    assert ran, "the probe did not start within 1 s of its launch: the side grid left no room"
    assert held, "the side launch ended while the probe waited: the test proves nothing"
    assert (probe.started.get() > 0).all()
    delay = probe.start_delay_ns()
    assert delay < START_BOUND_NS, (
        f"on the device the probe's first block started {delay / 1000:.1f} us after the mark "
        f"ended (the host took {probe.enqueue_s * 1000:.1f} ms to enqueue both; the mark "
        f"holds {HOLD_NS / 1e6:.0f} ms)"
    )


@pytest.mark.gpu
def test_without_reserve_training_kernel_waits_for_the_gate_to_close():
    """The control for the test above: with reserve=None the Spin grid takes every thread
    of every SM, so the probe must not start while it runs. A host-side close 200 ms on
    ends the side launch and releases it."""
    _, cp = _torch_cupy()
    probe = _Probe(cp)
    with fr.Harvester("cuda:0", reserve=None, time_slice=None) as h:
        t = _spin_forever(h)
        try:
            launches = t.launches
            enqueued = probe.enqueue()
            time.sleep(0.2)
            held = t.launches == launches and not t.done()
            closing = time.monotonic()
            early = probe.after.done
            h.gate.close(stream="host")
            released = probe.ran(timeout=10.0)
        finally:
            t.cancel()
            h.gate.open(stream="host")
        probe.stream.synchronize()
    assert held, "the side launch ended before the gate closed: the control proves nothing"
    assert not early, "without a reserve the probe still ran beside a grid that fills every SM"
    assert released, "the gate closed, yet the probe did not run within 10 s"
    # On the device too: the probe (which takes microseconds) ended after the close.
    waited = cp.cuda.get_elapsed_time(probe.before, probe.after) / 1000
    assert waited >= closing - enqueued - 0.005, (
        f"on the device the probe ended {waited:.3f} s after it was enqueued, but the gate "
        f"closed {closing - enqueued:.3f} s after"
    )


def _long_side_task(name, torch):
    """Side task `name` sized to keep its grid busy for seconds on an H100; the test needs
    it for about a tenth of a second, and checks that it was still running after."""
    dev = "cuda:0"
    if name == "Spin":
        return fr.tasks.Spin(items=2**40, ns_per_item=20_000)
    if name == "ItemCounter":
        # At most 8 blocks of 256 threads per SM: 2**20 items of 5 ms take over 4 s on 132.
        return fr.tasks.ItemCounter(2**20, ns_per_item=5_000_000)
    if name == "Saxpy":
        # One element per item: 2**30 items (8 GiB of x and y), each a claim and a count on
        # words every block shares, take over a second however fast the memory is.
        n = 2**30
        x, y = torch.ones(n, device=dev), torch.zeros(n, device=dev)
        return fr.tasks.Saxpy(1.0, x, y, chunk=1)
    if name == "PageRank":
        # 100,000 phases (2 per iteration), each a launch of its own and a round trip
        # through the executor thread, of 2048 items over 2**20 nodes of 8 random out-links.
        n, links = 2**20, 8
        indices = np.random.default_rng(0).integers(0, n, n * links)
        indptr = np.arange(0, n * links + 1, links)
        return fr.tasks.PageRank(indptr, indices, iters=50_000, nodes_per_item=512)
    if name == "GaussianBlur":
        # Radius 8000: 16,001 taps per pixel and pass over 64M pixels; an item (8 rows of
        # 64 pixels) takes about ten milliseconds.
        images = torch.zeros((32, 1, 32768, 64), dtype=torch.uint8, device=dev)
        return fr.tasks.GaussianBlur(images, sigma=2000.0)
    if name == "Resize":
        # 2**30 items of 8 output pixels (8 GiB of uint8): as Saxpy, bound by the claims.
        return fr.tasks.Resize(torch.zeros((1, 2, 2), dtype=torch.uint8, device=dev), (2**33, 1))
    assert name == "RawKernel", name
    return fr.tasks.RawKernel(_RAW_SPIN, "spin", items=2**40, args=(20_000,))


@pytest.mark.gpu
@pytest.mark.parametrize("reserve", RESERVES)
@pytest.mark.parametrize("name", SIDE_TASKS)
def test_receive_wait_on_training_stream_cannot_deadlock_with_side_work(name, reserve):
    """The training stream holds a receive that only ends when a kernel launched later on
    a third stream sets its flag, then the gate close, while task `name` runs (every
    built-in task and a RawKernel, one per case: the executor runs one task at a time).
    Without room on the SMs the send never starts, and the side launch, with no time
    slice, ends only at the close queued behind the receive: deadlock."""
    torch, cp = _torch_cupy()
    # Loaded, allocated and created before side work runs (see _Probe).
    kernels = cp.RawModule(code=_RECV_SEND)
    recv, send = kernels.get_function("recv"), kernels.get_function("send")
    flag = cp.zeros(1, dtype=cp.uint32)
    third = cp.cuda.Stream(non_blocking=True)
    train = torch.cuda.Stream(device="cuda:0", priority=-1)
    cp.cuda.Device().synchronize()
    with _harvester(reserve, time_slice=None) as h:
        t = h.submit(_long_side_task(name, torch))
        try:
            wait_until(lambda: t.items_done > 0 or t.done(), timeout=60)
            time.sleep(0.05)  # every block of the grid is up
            assert t.launches > 0 and not t.done(), f"{name} was not running before the receive"
            with torch.cuda.stream(train):
                recv((1,), (1,), (flag,), stream=cp.cuda.ExternalStream(train.cuda_stream))
                h.gate.close(stream=train)
            done = threading.Event()

            def finish():
                train.synchronize()
                done.set()

            waiter = threading.Thread(target=finish, daemon=True)
            waiter.start()
            time.sleep(0.01)
            with third:
                send((1,), (1,), (flag,))
            finished = done.wait(timeout=1.0)
            running = not t.done()
        finally:
            t.cancel()  # a deadlocked receive gets its room back, so the stream drains
            h.gate.open(stream="host")
        waiter.join(timeout=30)
    assert finished, f"the receive on the training stream did not end within 1 s beside {name}"
    assert running, f"{name} finished before the receive did: the test proves nothing"


# Operations that synchronise the whole device: torch.cuda.synchronize()
# (cudaDeviceSynchronize), and empty_cache() with a large freed segment to give back
# (cudaFree). A fresh allocation is not one of them: torch's allocator may serve it
# without any CUDA call, and cudaMalloc need not wait for running kernels.
DEVICE_WIDE_OPS = ["synchronize", "empty_cache"]


def _device_wide_sync(op, torch):
    """Seconds one `op` blocked (its deadline: 30 s)."""
    if op == "empty_cache":
        segment = torch.empty(256 << 20, dtype=torch.uint8, device="cuda:0")
        del segment  # cached by torch's allocator until empty_cache() frees it
    call = torch.cuda.synchronize if op == "synchronize" else torch.cuda.empty_cache
    begin = time.monotonic()
    finishes_within(30, call, f"{op} with side work running")
    return time.monotonic() - begin


@pytest.mark.gpu
@pytest.mark.parametrize("op", DEVICE_WIDE_OPS)
def test_device_wide_ops_wait_for_every_stream(op):
    """Negative control for the test below: each op waits for a ~50 ms kernel on another
    (non-blocking) stream, so it really is device-wide and would wait for a side launch
    that never ends. (A 64 MiB allocation, once in that list, did not wait at all.)"""
    torch = pytest.importorskip("torch")
    _device_wide_sync(op, torch)  # one-time costs first
    other = torch.cuda.Stream()
    with torch.cuda.stream(other):
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time at 2 GHz
    waited = _device_wide_sync(op, torch)
    assert other.query()
    print(f"{op} waited {waited * 1000:.1f} ms for ~50 ms of kernel on another stream")
    assert waited > 0.02, f"{op} returned after {waited * 1000:.1f} ms: it is not device-wide"


@pytest.mark.gpu
@pytest.mark.parametrize("op", DEVICE_WIDE_OPS)
@pytest.mark.parametrize("time_slice", [0.002, 0.02])
def test_device_wide_sync_with_gate_open_waits_about_a_slice(time_slice, op):
    torch = pytest.importorskip("torch")
    with fr.Harvester("cuda:0", time_slice=time_slice) as h:
        _device_wide_sync(op, torch)  # one-time costs (allocator set-up) before side work
        t = _spin_forever(h)
        try:
            waits = [_device_wide_sync(op, torch) for _ in range(5)]
            launches, running = t.launches, not t.done()
        finally:
            t.cancel()
    # The side task ran throughout: each sync saw at most the launch in flight (one slice)
    # and the host's relaunch.
    assert running, "the side task finished: the test proves nothing"
    assert launches > 1, "the side task was never relaunched: no slice ended"
    bound = 10 * time_slice + 0.1
    assert max(waits) < bound, (
        f"{op} waited {max(waits):.3f} s with side work running (slice {time_slice} s, "
        f"bound {bound:.3f} s); all waits: {[round(w, 4) for w in waits]}"
    )


@pytest.mark.gpu
def test_training_gets_priority_over_side_work_only_on_a_priority_stream():
    """Scheduling, not numbers: while a grid of many waves of short blocks runs on the
    harvester's side stream (CUDA's least priority, 0), a one-block kernel launched on a
    training stream of priority -1 starts as side blocks retire, long before the side grid
    ends. Negative control: on a training stream of priority 0 (torch's default, no more
    urgent than side work) the same kernel starts only in the side grid's last wave. Run
    in a fresh process with 32 hardware queues, so the two streams share none."""
    _torch_cupy()
    result = run_worker(
        "priority", {"block_ns": 20_000, "waves": 5_000}, {"CUDA_DEVICE_MAX_CONNECTIONS": 32}
    )
    assert result["side_priority"] == 0
    urgent, equal = result["runs"]
    assert urgent["priority"] < result["side_priority"] == equal["priority"]
    assert urgent["gap_ms"] > 20, (
        f"the priority -1 kernel started {urgent['gap_ms']:.3f} ms before the side grid "
        f"ended ({urgent['side_done_after_ms']:.1f} ms long): it waited for side work"
    )
    assert equal["gap_ms"] < 1, (
        f"negative control: at the side stream's priority the kernel still started "
        f"{equal['gap_ms']:.3f} ms before the side grid ended: the measurement cannot show "
        "priority"
    )


# A RawKernel whose items each stamp their start (%globaltimer) and spin `ns`.
_BUMP = r"""
#include <freeride/preempt.cuh>
extern "C" __global__ void bump(fr_item_ctx ctx, float* y, unsigned long long* starts,
                                unsigned long long ns) {
  freeride::for_each_item(ctx, [&](unsigned long long item) {
    if (threadIdx.x == 0) {
      unsigned long long t0, t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      starts[item] = t0;
      do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      } while (t - t0 < ns);
      y[item] += 1.0f;
    }
  });
}"""
RAW_ITEMS = 1 << 16


def _bump(torch):
    y = torch.zeros(RAW_ITEMS, device="cuda:0")
    starts = torch.zeros(RAW_ITEMS, dtype=torch.int64, device="cuda:0")
    task = fr.tasks.RawKernel(
        _BUMP, "bump", items=RAW_ITEMS, args=(y, starts.view(torch.uint64), 100_000)
    )
    return task, y, starts


def _raw_items_beside(counters, starts) -> int:
    """RawKernel items that started while some item of `counters` was running (both
    clocks are %globaltimer)."""
    intervals = np.concatenate([c.task.snapshot().times.reshape(-1, 2) for c in counters])
    intervals = intervals[intervals[:, 0] > 0]
    begins, ends = np.sort(intervals[:, 0]), np.sort(intervals[:, 1])
    t = starts.cpu().numpy().astype(np.uint64)
    t = t[t > 0]
    running = np.searchsorted(begins, t, "right") - np.searchsorted(ends, t, "left")
    return int((running > 0).sum())


def _counter():
    return fr.tasks.ItemCounter(100_000, 3, ns_per_item=100_000, record_times=True)


def _check_counters(counters):
    for handle in counters:
        snap = handle.task.snapshot()
        assert snap.violations == 0
        assert (snap.counts == 1).all(), "an item ran twice or never"


@pytest.mark.gpu
@pytest.mark.parametrize("stream_wait", [False, True])
def test_green_context_side_work_runs_exactly_once(stream_wait):
    """Built-in kernels in the green context and a RawKernel running at the same time on
    the primary context's side stream, under gate flips: every item of every phase runs
    once. An executor runs one launch at a time, so the RawKernel comes from a second
    harvester on the device; the items' %globaltimer stamps show that RawKernel items
    ran while built-in items did. Negative control: both tasks in one harvester run one
    after the other, and the same count is 0."""
    torch, _ = _torch_cupy()
    with _harvester(GREEN, stream_wait=stream_wait) as h:
        # The control: one harvester, one task at a time.
        alone = h.submit(_counter())
        task, y, starts = _bump(torch)
        after = h.submit(task)
        assert h.wait_all(timeout=120)
        _check_counters([alone])
        after.result()
        assert int((y == 1.0).sum()) == RAW_ITEMS
        sequential = _raw_items_beside([alone], starts)

        # RawKernel tasks run on the primary context's side stream under the occupancy
        # cap whatever the harvester's reserve.
        with fr.Harvester("cuda:0", reserve=CAP) as beside:
            task, y, starts = _bump(torch)
            raw = beside.submit(task)
            counters = [h.submit(_counter()) for _ in range(2)]
            for _ in range(20):
                for g in (h, beside):
                    g.gate.close(stream="host")
                time.sleep(0.002)
                for g in (h, beside):
                    g.gate.open(stream="host")
                time.sleep(0.003)
            assert h.wait_all(timeout=120)
            assert beside.wait_all(timeout=120)
            _check_counters(counters)
            raw.result()
            assert int((y == 1.0).sum()) == RAW_ITEMS
            concurrent = _raw_items_beside(counters, starts)
    print(
        f"RawKernel items started beside built-in items: {concurrent} of {RAW_ITEMS} "
        f"(one harvester: {sequential})"
    )
    assert sequential == 0, (
        f"negative control: {sequential} RawKernel items ran beside a built-in of the same "
        "harvester, which runs one launch at a time: the count is wrong"
    )
    assert concurrent > 100, (
        f"only {concurrent} RawKernel items started while a built-in ran: the test did not "
        "run them side by side"
    )


@pytest.mark.gpu
def test_backend_info_reports_the_green_context():
    with _harvester(GREEN) as h:
        mechanism = h.reserve_mechanism
        dev = fr.backend_info()["devices"][0]
        assert dev["reserve_mechanism"] == mechanism
        assert dev["reserve_fallback"] == ""
        assert fr.backend_info()["reserve_mechanism"] == mechanism
        # "green-context (120 of 132 SMs)": whole SMs left out, at least the default 8.
        inside, total = (int(w) for w in mechanism.split("(")[1].split()[::2][:2])
        assert total == dev["sm_count"]
        assert total - inside >= 8
    with fr.Harvester("cuda:0", reserve=CAP) as h:
        assert h.reserve_mechanism == "occupancy-cap"
        assert fr.backend_info()["devices"][0]["reserve_mechanism"] == "occupancy-cap"
    # The default reserve is the green context (the occupancy cap only where the driver
    # has none, with the reason).
    with fr.Harvester("cuda:0") as h:
        if fr.backend_info()["devices"][0]["green_contexts"]:
            assert h.reserve_mechanism.startswith("green-context ("), h.reserve_fallback
            assert h.reserve_fallback is None
        else:
            assert h.reserve_mechanism == "occupancy-cap"
            assert h.reserve_fallback
        assert fr.backend_info()["devices"][0]["reserve_mechanism"] == h.reserve_mechanism


def _green_partition():
    """(SMs in the default reserve's green context, SMs of the device, the SMs its
    partition check saw), skipping where the driver has no green contexts."""
    with fr.Harvester("cuda:0") as h:
        mechanism, fallback = h.reserve_mechanism, h.reserve_fallback
        dev = fr.backend_info()["devices"][0]
    if not dev["green_contexts"]:
        pytest.skip(f"no green contexts in this driver: {fallback}")
    match = re.fullmatch(r"green-context \((\d+) of (\d+) SMs\)", mechanism)
    assert match, f"the default reserve fell back: {fallback}"
    return int(match[1]), int(match[2]), dev["green_sms_seen"]


@pytest.mark.gpu
def test_green_context_launches_stay_on_its_sms():
    """G18: the grid the harvester's partition check launches on the green context's stream
    ran on no more SMs than the context holds, and (the GPU being idle) on all of them: the
    check fills whatever SMs it may use. The control: the same grid on a stream of the
    primary context, which no partition confines, reaches SMs the green context leaves
    out, so the check would have seen launches escape."""
    inside, total, seen = _green_partition()
    assert 0 < seen <= inside, (
        f"the partition check saw {seen} SMs for a green context of {inside}, yet kept it"
    )
    assert seen == inside, (
        f"the partition check's grid ran on {seen} of the green context's {inside} SMs on an "
        "idle GPU: it does not fill the SMs it may use, so it could miss launches that escape"
    )
    sms, blocks, beyond = _C._testing.sm_census_on_primary(0)
    assert beyond == 0 and blocks > 0, (sms, blocks, beyond)
    assert inside < sms <= total, (
        f"the census on the primary context saw {sms} SMs of {total}: it would not tell "
        f"launches confined to {inside} SMs from launches that escape"
    )


@pytest.mark.gpu
def test_launches_outside_the_green_context_fall_back_to_the_occupancy_cap():
    """G18: where the partition check sees the green context's blocks on more SMs than it
    holds (forced: one more), the harvester drops the green context for the occupancy cap,
    says why, reports what the check saw, and still runs every item exactly once. Control:
    without the switch the same harvester keeps its green context."""
    inside, total, _ = _green_partition()
    _C._testing.green_partition_overflow(True)
    try:
        with fr.Harvester("cuda:0") as h:
            assert h.reserve_mechanism == "occupancy-cap", h.reserve_mechanism
            assert h.reserve_fallback == (
                f"the green context's blocks ran on {inside + 1} SMs, more than its {inside} "
                f"(of {total}): the driver does not confine runtime launches to the partition"
            )
            dev = fr.backend_info()["devices"][0]
            assert dev["green_sms_seen"] == inside + 1
            assert dev["reserve_fallback"] == h.reserve_fallback
            h.gate.open(stream="host")
            counts = h.submit(fr.tasks.ItemCounter(20_000, phases=2)).result(60)
            assert counts.counts.min() == 1 and counts.counts.max() == 1
            assert counts.violations == 0
    finally:
        _C._testing.green_partition_overflow(False)
    assert _green_partition()[:2] == (inside, total)  # the switch is off again


@pytest.mark.gpu
def test_green_context_with_its_own_workqueues_where_the_driver_has_them(monkeypatch):
    """Issue 36 item 2: FREERIDE_GREEN_WORKQUEUE=balanced asks for a green context with
    workqueues of its own (a workqueue configuration of the balanced scope beside the SM
    group). A CUDA 13.1 driver gives them; an older one makes the green context without
    them and says why. Either way side work runs every item exactly once."""
    with fr.Harvester("cuda:0") as h:
        if h.green_workqueues is None:
            pytest.skip(f"no green context here: {h.reserve_fallback}")
    monkeypatch.setenv("FREERIDE_GREEN_WORKQUEUE", "balanced")
    driver = fr.backend_info()["driver_version"]
    with fr.Harvester("cuda:0") as h:
        # A context with them that then failed a check would fall back to the cap.
        assert h.reserve_mechanism.startswith("green-context"), h.reserve_fallback
        if driver >= 13010:
            assert h.green_workqueues == "balanced", h.green_workqueues
        else:
            assert h.green_workqueues.startswith("shared (balanced not had: "), h.green_workqueues
            assert "CUDA 13.1" in h.green_workqueues
        h.gate.open(stream="host")
        counts = h.submit(fr.tasks.ItemCounter(20_000, phases=2)).result(60)
        assert counts.counts.min() == 1 and counts.counts.max() == 1
        assert counts.violations == 0
    monkeypatch.delenv("FREERIDE_GREEN_WORKQUEUE")
    with fr.Harvester("cuda:0") as h:
        assert h.green_workqueues == "shared"  # the default: the device's, as before
