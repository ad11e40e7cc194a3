"""Every bad input gets a clear exception naming the argument, and the harvester stays usable."""

import numpy as np
import pytest

import freeride as fr


@pytest.mark.parametrize(
    "device, exc, match",
    [
        ("tpu", ValueError, "device must be"),
        ("cuda:x", ValueError, "device must be"),
        ("", ValueError, "device must be"),
        (1.5, TypeError, "device must be"),
        (True, TypeError, "device"),
    ],
)
def test_bad_device(device, exc, match):
    with pytest.raises(exc, match=match):
        fr.Harvester(device)


@pytest.mark.parametrize(
    "budget, exc, match",
    [
        ("8 gigs", ValueError, "memory_budget: cannot parse"),
        ("GiB", ValueError, "memory_budget: cannot parse"),
        ("-1GiB", ValueError, "memory_budget: cannot parse"),
        (0, ValueError, "memory_budget must be positive"),
        (-5, ValueError, "memory_budget must be positive"),
        (2**64, ValueError, "64 bits"),
        (1.5, TypeError, "memory_budget"),
        ([8], TypeError, "memory_budget"),
    ],
)
def test_bad_memory_budget(budget, exc, match):
    with pytest.raises(exc, match=match):
        fr.Harvester("cpu", memory_budget=budget)


@pytest.mark.parametrize(
    "text, nbytes",
    [("8GiB", 8 * 2**30), ("512 MB", 512 * 10**6), ("1.5KiB", 1536), ("100", 100), (4096, 4096)],
)
def test_memory_budget_parses(text, nbytes):
    with fr.Harvester("cpu", memory_budget=text, workers=1) as h:
        assert h.memory_budget == nbytes


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda: fr.tasks.Spin(0, 10), ValueError, "items must be >= 1"),
        (lambda: fr.tasks.Spin(-3, 10), ValueError, "items must be >= 1"),
        (lambda: fr.tasks.Spin(10, -1), ValueError, "ns_per_item must be >= 0"),
        (lambda: fr.tasks.Spin(10, 10, phases=0), ValueError, "phases must be >= 1"),
        (lambda: fr.tasks.Spin(2**63, 10), ValueError, "items must be <="),
        (lambda: fr.tasks.Spin(2**62, 10, phases=4), ValueError, "63 bits"),
        (lambda: fr.tasks.Spin(10, 2 * 10**9), ValueError, "ns_per_item must be <="),
        (lambda: fr.tasks.Spin(10.5, 10), TypeError, "items must be an integer"),
        (lambda: fr.tasks.Spin("10", 10), TypeError, "items must be an integer"),
        (
            lambda: fr.tasks.Saxpy(float("nan"), np.ones(4, np.float32), np.ones(4, np.float32)),
            ValueError,
            "a must be finite",
        ),
        (
            lambda: fr.tasks.Saxpy("2", np.ones(4, np.float32), np.ones(4, np.float32)),
            TypeError,
            "a must be a real number",
        ),
        (
            lambda: fr.tasks.Saxpy(2.0, np.ones(4, np.float32), np.ones(4, np.float32), chunk=0),
            ValueError,
            "chunk must be >= 1",
        ),
        (lambda: fr.tasks.ItemCounter(10, fail_at=(0, 10)), ValueError, r"fail_at\[1\]"),
    ],
)
def test_bad_task_arguments(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_huge_item_counts_use_64_bit_counters(host):
    # 2**40 items: beyond 32 bits, accepted (64-bit counters); cancel it after a few.
    t = host.submit(fr.tasks.Spin(2**40, 0))
    assert t.items_total == 2**40
    t.cancel()
    assert t.wait(timeout=10)
    assert t.state == "cancelled"


@pytest.mark.parametrize(
    "x, y, exc, match",
    [
        (
            np.ones(8, np.int32),
            np.ones(8, np.int32),
            TypeError,
            "x must have dtype float32 or float64",
        ),
        (np.ones(8, np.float32), np.ones(8, np.float64), TypeError, "same dtype"),
        (np.ones(8, np.float32), np.ones(9, np.float32), ValueError, "same number of elements"),
        (np.ones(16, np.float32)[::2], np.ones(8, np.float32), ValueError, "x must be contiguous"),
        (np.ones(8, np.float32), np.ones(16, np.float32)[::2], ValueError, "y must be contiguous"),
        (np.ones(0, np.float32), np.ones(0, np.float32), ValueError, "x must not be empty"),
        ([1.0, 2.0], np.ones(2, np.float32), TypeError, "x must be a torch tensor"),
    ],
)
def test_bad_saxpy_arrays(host, x, y, exc, match):
    with pytest.raises(exc, match=match):
        host.submit(fr.tasks.Saxpy(1.0, x, y))
    t = host.submit(fr.tasks.Spin(4, 100))  # still usable
    assert t.wait(timeout=10) and t.state == "done"


def test_saxpy_aliasing_and_readonly(host):
    y = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="same memory"):
        host.submit(fr.tasks.Saxpy(1.0, y, y))
    ro = np.ones(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="y must be writable"):
        host.submit(fr.tasks.Saxpy(1.0, np.ones(8, np.float32), ro))


def test_torch_tensor_checks(host):
    torch = pytest.importorskip("torch")
    x = torch.ones(8)
    with pytest.raises(ValueError, match="y must not require grad"):
        host.submit(fr.tasks.Saxpy(1.0, x, torch.ones(8, requires_grad=True)))
    with pytest.raises(ValueError, match="x must be contiguous"):
        host.submit(fr.tasks.Saxpy(1.0, torch.ones(4, 4).t(), torch.ones(4, 4)))
    with pytest.raises(TypeError, match="x must have dtype"):
        host.submit(fr.tasks.Saxpy(1.0, torch.ones(8, dtype=torch.float16), torch.ones(8)))
    if not torch.cuda.is_available():
        meta = torch.ones(8, device="meta")
        with pytest.raises(ValueError, match="x must be on cpu"):
            host.submit(fr.tasks.Saxpy(1.0, meta, torch.ones(8)))


def test_submit_rejects_non_tasks(host):
    with pytest.raises(TypeError, match="task must be a freeride task"):
        host.submit(lambda: None)
    with pytest.raises(TypeError, match="priority must be an integer"):
        host.submit(fr.tasks.Spin(1, 1), priority=1.5)


def test_result_of_failed_and_cancelled_tasks(host):
    bad = host.submit(fr.tasks.ItemCounter(10, fail_at=(0, 3)))
    with pytest.raises(fr.TaskFailedError, match="injected failure"):
        bad.result(timeout=10)
    host.gate.close(stream="host")
    c = host.submit(fr.tasks.Spin(5, 10))
    c.cancel()
    with pytest.raises(fr.TaskCancelledError):
        c.result()
    with pytest.raises(TimeoutError):
        host.submit(fr.tasks.Spin(5, 10)).result(timeout=0.05)
    with pytest.raises(ValueError, match="timeout"):
        c.wait(timeout=-1)


def test_workers_argument(host):
    with pytest.raises(ValueError, match="workers must be >= 1"):
        fr.Harvester("cpu", workers=0)
    with pytest.raises(TypeError, match="gate_in_host_memory"):
        fr.Harvester("cpu", gate_in_host_memory="yes")
