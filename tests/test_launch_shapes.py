"""What a launch asks CUDA about its kernel, asked once per backend (review G9).

Sizing a side kernel's grid asked the runtime or driver, at every launch, for the
kernel's occupancy and, under a reserve, its registers and static shared memory, and set
its shared-memory carveout again: launches at opens do this on a training thread. The
CUDA backend now keeps the answers (csrc/cuda/launch_shapes.hpp), and sets a carveout
only where it differs from the one it last set. These tests drive that cache with Python
callables in place of the CUDA queries (its logic takes them as callables); the CUDA
calls around it (csrc/kernels/common.cuh's persistent_grid, RawKernel's launch) need a
GPU and are covered by the GPU tests of reserves and RawKernel.
"""

import threading
import time

import pytest

from freeride import _C

KERNEL = 0x1000
OTHER = 0x2000


class Calls:
    """A query that counts its calls and answers `value`, or raises while `fail`."""

    def __init__(self, value, delay=0.0):
        self.value = value
        self.delay = delay
        self.fail = False
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self, *args):
        with self.lock:
            self.count += 1
        if self.delay:
            time.sleep(self.delay)  # lets the GIL go: other threads reach the cache meanwhile
        if self.fail:
            raise RuntimeError("CUDA error in the query")
        return self.value


def test_occupancy_is_asked_once_per_kernel_and_shape():
    """Occupancy depends on the kernel, its threads and its dynamic shared memory: each
    such key is asked once, and any other key is asked on its own."""
    shapes = _C._testing.LaunchShapes()
    query = Calls(6)
    assert shapes.occupancy(KERNEL, 256, 0, query) == 6
    assert shapes.occupancy(KERNEL, 256, 0, query) == 6
    assert query.count == 1
    for key in ((KERNEL, 512, 0), (KERNEL, 256, 1024), (OTHER, 256, 0)):
        other = Calls(3)
        assert shapes.occupancy(*key, other) == 3
        assert shapes.occupancy(*key, other) == 3
        assert other.count == 1, key
    assert shapes.occupancy(KERNEL, 256, 0, query) == 6  # the first answer, kept
    assert query.count == 1


def test_an_occupancy_of_zero_is_an_answer():
    """A kernel that fits no block is answered 0 (persistent_grid then launches one
    block, or refuses under a reserve): that too is asked once."""
    shapes = _C._testing.LaunchShapes()
    query = Calls(0)
    assert shapes.occupancy(KERNEL, 1024, 0, query) == 0
    assert shapes.occupancy(KERNEL, 1024, 0, query) == 0
    assert query.count == 1


def test_attributes_are_asked_once_per_kernel():
    """Registers and static shared memory belong to the function, not to the launch's
    shape: one question per kernel."""
    shapes = _C._testing.LaunchShapes()
    query = Calls((40, 2048))
    assert shapes.attributes(KERNEL, query) == (40, 2048)
    assert shapes.attributes(KERNEL, query) == (40, 2048)
    assert query.count == 1
    other = Calls((32, 0))
    assert shapes.attributes(OTHER, other) == (32, 0)
    assert other.count == 1
    assert shapes.attributes(KERNEL, query) == (40, 2048)
    assert query.count == 1


def test_the_carveout_is_set_only_when_it_changes():
    """Per function: set where the value differs from the last one this cache set on
    that function (another kernel's carveout is its own)."""
    shapes = _C._testing.LaunchShapes()
    set_to = []
    assert shapes.set_carveout(KERNEL, 50, set_to.append)
    assert not shapes.set_carveout(KERNEL, 50, set_to.append)
    assert shapes.set_carveout(KERNEL, 60, set_to.append)
    assert not shapes.set_carveout(KERNEL, 60, set_to.append)
    assert shapes.set_carveout(KERNEL, 50, set_to.append)
    assert shapes.set_carveout(OTHER, 50, set_to.append)
    assert not shapes.set_carveout(OTHER, 50, set_to.append)
    assert set_to == [50, 60, 50, 50]


def test_setting_a_kernels_carveout_has_its_occupancy_asked_again_once():
    """The driver's occupancy answer may read the function's preferred carveout, and the
    first answer may have been taken under another (the default, an earlier harvester's):
    a set that changes the carveout forgets that kernel's occupancy, at every shape, and
    the next launch asks once more; an unchanged carveout keeps the answer, and another
    kernel's answers stay."""
    shapes = _C._testing.LaunchShapes()
    query, other = Calls(4), Calls(2)
    assert shapes.occupancy(KERNEL, 256, 0, query) == 4
    assert shapes.occupancy(KERNEL, 512, 0, query) == 4
    assert shapes.occupancy(OTHER, 256, 0, other) == 2
    assert query.count == 2 and other.count == 1
    shapes.set_carveout(KERNEL, 50, lambda percent: None)
    query.value = 3  # its answer under the new carveout
    assert shapes.occupancy(KERNEL, 256, 0, query) == 3
    assert shapes.occupancy(KERNEL, 512, 0, query) == 3
    assert query.count == 4
    assert not shapes.set_carveout(KERNEL, 50, lambda percent: None)
    assert shapes.occupancy(KERNEL, 256, 0, query) == 3
    assert query.count == 4
    assert shapes.occupancy(OTHER, 256, 0, other) == 2 and other.count == 1


def test_each_cache_starts_empty():
    """A backend's cache is its own: a new harvester (after a device reset, or with
    another reserve) asks again and sets its carveout once."""
    first, second = _C._testing.LaunchShapes(), _C._testing.LaunchShapes()
    query = Calls(4)
    set_to = []
    first.occupancy(KERNEL, 128, 0, query)
    first.set_carveout(KERNEL, 30, set_to.append)
    second.occupancy(KERNEL, 128, 0, query)
    assert second.set_carveout(KERNEL, 30, set_to.append)
    assert query.count == 2
    assert set_to == [30, 30]


def test_a_failing_query_caches_nothing_and_rethrows():
    """The query's error reaches the launch as it did, and the next launch asks again
    (a transient failure is not kept, a lasting one fails every launch as before)."""
    shapes = _C._testing.LaunchShapes()
    occupancy = Calls(5)
    occupancy.fail = True
    for _ in range(2):
        with pytest.raises(RuntimeError, match="CUDA error in the query"):
            shapes.occupancy(KERNEL, 256, 0, occupancy)
    assert occupancy.count == 2
    occupancy.fail = False
    assert shapes.occupancy(KERNEL, 256, 0, occupancy) == 5
    assert shapes.occupancy(KERNEL, 256, 0, occupancy) == 5
    assert occupancy.count == 3

    attributes = Calls((16, 0))
    attributes.fail = True
    with pytest.raises(RuntimeError, match="CUDA error in the query"):
        shapes.attributes(KERNEL, attributes)
    attributes.fail = False
    assert shapes.attributes(KERNEL, attributes) == (16, 0)
    assert shapes.attributes(KERNEL, attributes) == (16, 0)
    assert attributes.count == 2


def test_a_failing_carveout_set_records_nothing():
    """Where the set fails, the function's setting is unknown: the next launch sets it,
    even to the value set before the failure."""
    shapes = _C._testing.LaunchShapes()
    good = Calls(None)
    bad = Calls(None)
    bad.fail = True
    assert shapes.set_carveout(KERNEL, 50, good)
    with pytest.raises(RuntimeError, match="CUDA error in the query"):
        shapes.set_carveout(KERNEL, 60, bad)
    assert shapes.set_carveout(KERNEL, 50, good)
    assert not shapes.set_carveout(KERNEL, 50, good)
    with pytest.raises(RuntimeError, match="CUDA error in the query"):
        shapes.set_carveout(OTHER, 40, bad)
    assert shapes.set_carveout(OTHER, 40, good)
    assert (good.count, bad.count) == (3, 2)


def run_together(count, body):
    """Runs body(i) on `count` threads released at once; re-raises the first error."""
    start = threading.Barrier(count)
    errors = []

    def run(i):
        try:
            start.wait()
            body(i)
        except BaseException as e:  # noqa: BLE001 - reported on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_concurrent_first_launches_ask_once():
    """Launches come from the executor thread and from training threads at once: a
    slow first question is asked once per key, and every thread gets its answer."""
    shapes = _C._testing.LaunchShapes()
    queries = {threads: Calls(threads // 64, delay=0.02) for threads in (64, 128, 256)}
    attributes = Calls((24, 512), delay=0.02)
    answers = []

    def launch(i):
        threads = (64, 128, 256)[i % 3]
        answers.append((threads, shapes.occupancy(KERNEL, threads, 0, queries[threads])))
        assert shapes.attributes(KERNEL, attributes) == (24, 512)

    run_together(12, launch)
    assert sorted(answers) == sorted((t, t // 64) for t in (64, 128, 256) for _ in range(4))
    assert [q.count for q in queries.values()] == [1, 1, 1]
    assert attributes.count == 1


def test_concurrent_carveouts_match_the_last_set():
    """Launches of one function with different shapes may want different carveouts at
    once: the value the cache records is always the one last set on the function, so a
    launch it skips runs with the carveout it asked for."""
    shapes = _C._testing.LaunchShapes()
    current = {}  # the function's setting, as the driver would hold it

    def set_on(kernel):
        def set_to(percent):
            time.sleep(0.002)  # between the cache's check and its record: other threads run
            current[kernel] = percent

        return set_to

    for round_ in range(5):

        def launch(i, round_=round_):
            kernel = (KERNEL, OTHER)[i % 2]
            shapes.set_carveout(kernel, 10 * (i + round_ % 3 + 1), set_on(kernel))

        run_together(8, launch)
        for kernel, percent in current.items():
            # What the cache believes is what the function holds: asking for it sets nothing.
            assert not shapes.set_carveout(kernel, percent, set_on(kernel)), (round_, kernel)
