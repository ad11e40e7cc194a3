"""A task that needs more than the harvester's whole memory budget is refused before its
buffers are made (on a GPU they would take memory training may need), and the need the
refusal is judged on is the memory the built task holds."""

import numpy as np
import pytest
import torch

import freeride as fr
from freeride.tasks._base import build_within


def _graph(nodes: int, edges: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = np.sort(rng.integers(0, nodes, edges))
    indices = rng.integers(0, nodes, edges)
    indptr = np.searchsorted(src, np.arange(nodes + 1)).astype(np.int64)
    return indptr, indices


TASKS = {
    "pagerank": lambda: fr.tasks.PageRank(*_graph(300, 2000), iters=7),
    "pagerank_no_edges": lambda: fr.tasks.PageRank(np.zeros(5, np.int64), np.zeros(0, np.int64)),
    "item_counter": lambda: fr.tasks.ItemCounter(100, phases=3),
    "item_counter_times": lambda: fr.tasks.ItemCounter(100, phases=3, record_times=True),
    "blur_uint8": lambda: fr.tasks.GaussianBlur(np.zeros((2, 3, 20, 30), np.uint8), 1.5),
    "blur_float32": lambda: fr.tasks.GaussianBlur(torch.zeros(4, 16, 16), 0.7),
    "resize_uint8": lambda: fr.tasks.Resize(np.zeros((3, 20, 30), np.uint8), (7, 41)),
    "resize_float32": lambda: fr.tasks.Resize(torch.zeros(2, 3, 10, 10), 25),
}


def _held(buffers) -> int:
    """Bytes of the arrays a built task keeps (the caller's inputs included)."""
    return sum(
        b.numel() * b.element_size() if isinstance(b, torch.Tensor) else b.nbytes
        for b in buffers
        if b is not None
    )


@pytest.mark.parametrize("make", TASKS.values(), ids=TASKS.keys())
def test_the_need_is_what_the_built_task_holds(make):
    task = make()
    built = task._build("host", -1)
    assert task._memory_need("host", -1) == built.core.memory_bytes == _held(built.keep)
    # and the phases and items a refused task's handle reports are the built core's
    phases, items = task._work()
    assert (built.core.num_phases, built.core.total_items) == (phases, phases * items)
    assert all(built.core.num_items(p) == items for p in range(phases))


@pytest.mark.parametrize("make", TASKS.values(), ids=TASKS.keys())
def test_a_task_past_the_whole_budget_is_refused_before_anything_is_made(make, monkeypatch):
    task = make()
    need = task._memory_need("host", -1)
    phases, items = task._work()

    def made(*args):
        raise AssertionError("buffers made for a task past the whole budget")

    monkeypatch.setattr(type(task), "_build", made)
    with fr.Harvester("cpu", memory_budget=need - 1, workers=1) as h:
        handle = h.submit(task)
        assert handle.wait(timeout=10) and handle.state == "failed"
        with pytest.raises(fr.MemoryBudgetError) as err:
            handle.result()
        assert str(err.value) == (
            f"{type(task).__name__} needs {need} bytes of device memory, more than the "
            f"harvester's whole memory_budget of {need - 1} bytes"
        )
        assert h.memory_used == 0
        # it reads as the task it stands for, not as one with nothing to do
        assert handle.items_total == phases * items
        assert handle.items_done == 0 and handle.progress == 0.0
        # the harvester goes on: a task within the budget still runs
        small = h.submit(fr.tasks.Spin(4, 0))
        assert small.wait(timeout=10) and small.state == "done"


@pytest.mark.parametrize("make", TASKS.values(), ids=TASKS.keys())
def test_a_task_within_the_whole_budget_is_built_and_runs(make):
    task = make()
    with fr.Harvester("cpu", memory_budget=task._memory_need("host", -1), workers=1) as h:
        handle = h.submit(task)
        assert handle.wait(timeout=30) and handle.state == "done"
        handle.result()


def test_a_task_that_cannot_tell_its_need_is_built_and_checked_on_what_it_holds():
    # Saxpy makes nothing (it works in the caller's arrays): the executor's own check
    # judges it, as before.
    x, y = np.ones(1024, np.float32), np.ones(1024, np.float32)
    task = fr.tasks.Saxpy(2.0, x, y)
    assert task._memory_need("host", -1) is None
    built = build_within(task, "host", -1, budget=100)
    assert built.core.name == "Saxpy" and built.core.memory_bytes == 8192
    with fr.Harvester("cpu", memory_budget=100, workers=1) as h:
        handle = h.submit(task)
        assert handle.wait(timeout=10) and handle.state == "failed"
        with pytest.raises(fr.MemoryBudgetError, match="Saxpy needs 8192 bytes"):
            handle.result()
    np.testing.assert_array_equal(y, np.ones(1024, np.float32))


@pytest.mark.parametrize(
    "images, exc, match",
    [
        (np.zeros((2, 50, 50), np.float64), TypeError, "images must have dtype uint8 or float32"),
        (torch.zeros(2, 50, 50).to_sparse(), TypeError, "images must be a dense tensor"),
        (torch.zeros(2, 50, 50).transpose(1, 2), ValueError, "images must be contiguous"),
    ],
)
def test_bad_images_are_reported_as_such_whatever_the_budget(images, exc, match):
    # not as over the budget: the need is told after the checks that allocate nothing
    # (a sparse tensor is refused as soon as the task is made)
    with fr.Harvester("cpu", memory_budget=1, workers=1) as h, pytest.raises(exc, match=match):
        h.submit(fr.tasks.GaussianBlur(images, 1.0))


def test_the_placeholder_stands_for_the_task_and_fails_if_ever_run():
    built = build_within(fr.tasks.ItemCounter(1000, phases=3), "host", -1, budget=16)
    assert built.core.name == "ItemCounter"
    assert built.core.num_phases == 3 and built.core.total_items == 3000
    assert built.core.memory_bytes == 4 * 3000 + 8 * 3 + 8
    assert built.keep == ()
    # Only a harvester whose budget it exceeds is given one; on one without a budget
    # (the executor reached by hand) its first item fails it: no hang, nothing done.
    with fr.Harvester("cpu", workers=1) as h:
        task_id = h._ex.submit(built.core, 0, [])
        assert h._ex.wait(task_id, 10.0)
        state, done, total = h._ex.status(task_id)[:3]
        assert (state, done, total) == ("failed", 0, 3000)
    with pytest.raises(ValueError, match="at least one phase and item"):
        fr._C.unbuilt_task("X", 10, 0, 5)


@pytest.mark.gpu
def test_on_a_gpu_a_refused_task_takes_no_device_memory():
    task = fr.tasks.PageRank(*_graph(200_000, 1_000_000), iters=5)
    need = task._memory_need("cuda", 0)  # about 16 MB
    with fr.Harvester("cuda", memory_budget=need // 2) as h:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        handle = h.submit(task)
        assert handle.wait(timeout=30) and handle.state == "failed"
        assert torch.cuda.memory_allocated() == before
        with pytest.raises(fr.MemoryBudgetError, match=f"PageRank needs {need} bytes"):
            handle.result()
        small = h.submit(fr.tasks.PageRank(*_graph(1000, 5000), iters=5))
        assert small.wait(timeout=60) and small.state == "done"
        assert abs(float(small.result().sum()) - 1.0) < 1e-9
