"""What a side task uses stays alive until the task is final, whatever the caller keeps,
and is let go once it is final; on a GPU, side work starts only after what the caller's
stream did before submit, and results are complete for any stream once wait() returns."""

import gc
import time
import weakref

import pytest
from gpu_worker import finishes_within

import freeride as fr
from conftest import os_thread_ids, wait_until

torch = pytest.importorskip("torch")


class AddTwice(fr.IterativeTask):
    """One step: y += 2 * x (on a GPU, on the step stream)."""

    total_steps = 1

    def __init__(self, x, y):
        self.x, self.y = x, y
        self.steps = 0

    def step(self):
        self.y.add_(self.x, alpha=2.0)
        self.steps += 1

    def finished(self):
        return self.steps >= self.total_steps


class Forever(fr.IterativeTask):
    """Short steps that never finish."""

    def __init__(self):
        self.steps = 0

    def step(self):
        self.steps += 1
        time.sleep(0.001)


def test_dropped_handle_keeps_the_task_and_its_buffers_alive(host):
    """The crash this guards against: with the gate closed, a Resize whose handle was
    dropped had its output freed, and opening the gate wrote into freed memory."""
    images = torch.rand(8, 3, 64, 64)
    images_ref = weakref.ref(images)
    host.gate.close(stream="host")
    handle = host.submit(fr.tasks.Resize(images, (128, 128)))
    task_id = handle.id
    del images, handle
    gc.collect()
    assert images_ref() is not None, "the input went away while the task was queued"
    assert [h.id for h in host.tasks()] == [task_id]  # still reachable while not final
    fresh = torch.zeros(8, 3, 128, 128)  # where a freed output could be reused
    host.gate.open(stream="host")
    assert host.wait_all(timeout=60)
    assert not fresh.any(), "side work wrote memory it no longer owned"
    gc.collect()
    assert host.tasks() == []
    assert images_ref() is None, "a final task's buffers must be let go"


def test_buffers_are_released_after_cancel_and_close():
    x = torch.ones(1 << 12)
    y = torch.zeros(1 << 12)
    refs = weakref.ref(x), weakref.ref(y)
    h = fr.Harvester("cpu", workers=2)
    h.gate.close(stream="host")
    handle = h.submit(fr.tasks.Saxpy(2.0, x, y))
    del x, y
    assert handle.cancel()
    del handle
    h.tasks()  # lets go of final tasks
    gc.collect()
    assert all(r() is None for r in refs)

    z = torch.ones(1 << 12)
    z_ref = weakref.ref(z)
    h.submit(fr.tasks.Saxpy(2.0, torch.ones(1 << 12), z))
    del z
    gc.collect()
    assert z_ref() is not None
    h.close()  # cancels the queued task
    gc.collect()
    assert z_ref() is None


def test_final_tasks_are_let_go_at_the_end_of_each_recorded_iteration(host):
    y = torch.zeros(1 << 10)
    y_ref = weakref.ref(y)
    host.submit(fr.tasks.Saxpy(1.0, torch.ones(1 << 10), y))
    del y
    wait_until(lambda: host._ex.status(1)[0] == "done")
    with host.iteration():  # what attach() does around every step
        pass
    gc.collect()
    assert y_ref() is None


@pytest.mark.parametrize("iterative", [False, True], ids=["kernel", "iterative"])
def test_a_dropped_harvester_is_closed_without_the_cyclic_gc(iterative):
    """A harvester dropped without close() stops its threads and lets go of its tasks
    when its last reference goes: nothing it owns points back at it, so neither the
    cyclic GC nor (with iterative tasks) a runner thread keeps it alive."""
    before = os_thread_ids()
    gc.disable()  # whatever passes here passes without the cyclic GC
    try:
        h = fr.Harvester("cpu", workers=2)
        ex = h._ex
        kernel = h.submit(fr.tasks.Spin(10**9, 20_000))
        wait_until(lambda: kernel.state == "running")
        steps = h.submit(Forever()) if iterative else None
        if steps is not None:
            wait_until(lambda: steps.items_done > 0)
        with h.iteration():  # the recorder calls back into the harvester at its end
            pass
        gate = h.gate
        ref = weakref.ref(h)
        del h
        assert ref() is None, "something still holds the dropped harvester"
        assert ex.closed
        with pytest.raises(fr.HarvesterClosedError):
            gate.open()
        assert kernel.state == "cancelled"
        if steps is not None:
            assert steps.state == "cancelled"
        assert os_thread_ids() <= before, "threads left behind"
    finally:
        gc.enable()


# -- GPU -----------------------------------------------------------------------------------


@pytest.fixture
def gpu():
    with fr.Harvester("cuda:0") as h:
        yield h


def _warm(h):
    """One launch first: a kernel's first (lazy) load synchronises, hiding races."""
    x = torch.ones(1024, device="cuda")
    y = torch.zeros(1024, device="cuda")
    assert h.submit(fr.tasks.Saxpy(1.0, x, y)).wait(timeout=60)


# y += 2 * ones, as a kernel task and as an iterative task's step.
ADD_TWICE = {
    "kernel": lambda ones, y: fr.tasks.Saxpy(2.0, ones, y),
    "iterative": AddTwice,
}


@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(ADD_TWICE))
@pytest.mark.parametrize("where", ["current", "argument"])
def test_side_work_waits_for_the_callers_stream(gpu, where, kind):
    _warm(gpu)
    make = ADD_TWICE[kind]
    small = torch.zeros(1024, device="cuda")
    assert gpu.submit(make(torch.ones_like(small), small)).wait(timeout=60)  # warm-up
    n = 1 << 22
    ones = torch.ones(n, device="cuda")
    y = torch.empty(n, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time before y is ready
        y.fill_(1.0)
        if where == "current":
            handle = gpu.submit(make(ones, y))
    if where == "argument":
        handle = gpu.submit(make(ones, y), stream=stream)
    assert handle.wait(timeout=60)
    # No synchronisation: wait() returning True means the results are complete for any
    # later work on any stream.
    other = torch.cuda.Stream()
    with torch.cuda.stream(other):
        wrong = int((y != 3.0).sum())
    assert wrong == 0, f"{wrong} of {n} elements read y before it was ready"


@pytest.mark.gpu
def test_dropped_gpu_task_does_not_write_freed_memory(gpu):
    """The H100 reproduction: a Resize submitted with the gate closed and its handle
    dropped overwrote a tensor allocated afterwards in the freed output's place."""
    _warm(gpu)
    images = torch.rand(64, 3, 512, 512, device="cuda")
    gpu.gate.close(stream="host")
    gpu.submit(fr.tasks.Resize(images, (1024, 1024)))
    del images
    gc.collect()
    fresh = torch.zeros(64, 3, 1024, 1024, device="cuda")
    gpu.gate.open(stream="host")
    assert gpu.wait_all(timeout=120)
    torch.cuda.synchronize()
    assert int(fresh.count_nonzero()) == 0


# ~2 s of GPU time at ~2 GHz: far longer than a small side task, or close(), takes.
LONG_SLEEP_CYCLES = 4_000_000_000


def _saxpy():
    return fr.tasks.Saxpy(
        2.0, torch.ones(1 << 16, device="cuda"), torch.ones(1 << 16, device="cuda")
    )


@pytest.mark.gpu
def test_task_waiting_on_a_busy_stream_does_not_hold_the_executor(gpu):
    """The executor used to admit the first task and wait in it for the caller's stream,
    running nothing else meanwhile."""
    _warm(gpu)
    first_task, second_task = _saxpy(), _saxpy()
    busy = torch.cuda.Stream()
    with torch.cuda.stream(busy):
        torch.cuda._sleep(LONG_SLEEP_CYCLES)
    first = gpu.submit(first_task, stream=busy)
    second = gpu.submit(second_task)
    assert second.wait(timeout=60)
    state, items_done = first.state, first.items_done
    assert not busy.query(), "the sleep ended before the check: it proves nothing"
    assert state == "queued" and items_done == 0
    assert first.wait(timeout=60) and first.state == "done"
    assert int((first.result() != 3.0).sum()) == 0


@pytest.mark.gpu
def test_close_with_a_task_waiting_on_a_busy_stream_returns():
    h = fr.Harvester("cuda:0")
    _warm(h)
    busy = torch.cuda.Stream()
    with torch.cuda.stream(busy):
        torch.cuda._sleep(LONG_SLEEP_CYCLES)
    waiting = h.submit(_saxpy(), stream=busy)
    finishes_within(30, h.close, "Harvester.close() with a task waiting on a busy stream")
    assert not busy.query(), "close() waited for the stream the task depends on"
    assert waiting.state == "cancelled"
    busy.synchronize()
