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
    with pytest.raises(ValueError, match="x and y must not share memory"):
        host.submit(fr.tasks.Saxpy(1.0, y, y))
    # Partly overlapping: each result would depend on which item ran first.
    buf = np.arange(1, 11, dtype=np.float32)
    with pytest.raises(ValueError, match="x and y must not share memory"):
        host.submit(fr.tasks.Saxpy(2.0, buf[:-1], buf[1:], chunk=1))
    # Adjacent halves of one buffer share nothing.
    t = host.submit(fr.tasks.Saxpy(2.0, buf[:5], buf[5:], chunk=1))
    assert t.wait(10) and t.state == "done"
    assert buf[5:].tolist() == [8.0, 11.0, 14.0, 17.0, 20.0]
    ro = np.ones(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="y must be writable"):
        host.submit(fr.tasks.Saxpy(1.0, np.ones(8, np.float32), ro))


def test_arrays_in_the_other_byte_order_are_refused(host):
    # numpy names '>f4' "float32" too: its bytes would be read as garbage.
    x = np.arange(1, 5, dtype=">f4")
    with pytest.raises(TypeError, match="x must be in this machine's byte order, got dtype >f4"):
        host.submit(fr.tasks.Saxpy(2.0, x, np.zeros(4, np.float32)))
    with pytest.raises(TypeError, match="images must be in this machine's byte order"):
        host.submit(fr.tasks.GaussianBlur(np.ones((1, 8, 8), dtype=">f4"), 1.0))


def test_a_tensor_over_read_only_memory_is_refused(host, tmp_path):
    # torch keeps no read-only flag: from_numpy of a memmap opened "r" faulted the side
    # task's first write (a segfault).
    torch = pytest.importorskip("torch")
    path = tmp_path / "ro.bin"
    np.ones(1024, np.float32).tofile(path)
    ro = np.memmap(path, dtype=np.float32, mode="r")
    with pytest.warns(UserWarning):  # torch's own, about the array not being writable
        y = torch.from_numpy(ro)
    with pytest.raises(ValueError, match="y must be writable: its memory is mapped read-only"):
        host.submit(fr.tasks.Saxpy(1.0, torch.ones(1024), y))
    # A writable mapping of the same file is fine.
    rw = torch.from_numpy(np.memmap(path, dtype=np.float32, mode="r+"))
    t = host.submit(fr.tasks.Saxpy(1.0, torch.ones(1024), rw))
    assert t.wait(10) and t.state == "done" and float(rw[0]) == 2.0


def test_images_resized_since_the_task_was_made_are_refused(host):
    # The kernels read the shape recorded when the task was made: past the end of an
    # array shrunk since (a segfault before).
    torch = pytest.importorskip("torch")
    images = torch.rand(1, 64, 64)
    task = fr.tasks.GaussianBlur(images, 0.5)
    images.set_(torch.rand(1, 1, 1))
    with pytest.raises(ValueError, match=r"images changed shape since the task was made"):
        host.submit(task)


@pytest.mark.parametrize(
    "timeout, exc, match",
    [
        (-5, ValueError, "timeout must be None or >= 0, got -5.0"),
        (float("nan"), ValueError, "timeout must be None or >= 0, got nan"),
        ("1", TypeError, "timeout must be None or a number of seconds, got str"),
        (True, TypeError, "timeout must be None or a number of seconds, got bool"),
    ],
)
def test_bad_timeouts_are_refused_not_waited_out(host, timeout, exc, match):
    # A negative or NaN timeout waited for ever before (h.wait_all(-5) until the gate
    # opened), a string failed deep in a wait.
    host.gate.close(stream="host")
    t = host.submit(fr.tasks.Spin(4, 100))
    for call in (
        lambda: t.wait(timeout),
        lambda: t.result(timeout),
        lambda: t.cancel(timeout=timeout),
        lambda: host.wait_all(timeout),
        lambda: host.report(timeout=timeout),
    ):
        with pytest.raises(exc, match=match):
            call()
    host.gate.open(stream="host")
    assert t.wait(float("inf")) and t.state == "done"  # infinity: no limit


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_torch_tensor_checks(host):
    torch = pytest.importorskip("torch")
    x = torch.ones(8)
    with pytest.raises(ValueError, match="y must not require grad"):
        host.submit(fr.tasks.Saxpy(1.0, x, torch.ones(8, requires_grad=True)))
    with pytest.raises(ValueError, match="x must be contiguous"):
        host.submit(fr.tasks.Saxpy(1.0, torch.ones(4, 4).t(), torch.ones(4, 4)))
    with pytest.raises(TypeError, match="x must have dtype"):
        host.submit(fr.tasks.Saxpy(1.0, torch.ones(8, dtype=torch.float16), torch.ones(8)))
    # no single data pointer to hand the core: refused by name, not torch's own error
    with pytest.raises(TypeError, match="x must be a dense tensor; got layout torch.sparse_coo"):
        host.submit(fr.tasks.Saxpy(1.0, torch.ones(8).to_sparse(), torch.ones(8)))
    with pytest.raises(TypeError, match="y must be a dense tensor; got layout torch.sparse_csr"):
        host.submit(fr.tasks.Saxpy(1.0, torch.ones(2, 4), torch.ones(2, 4).to_sparse_csr()))
    with pytest.raises(TypeError, match="images must be a dense tensor"):
        host.submit(fr.tasks.GaussianBlur(torch.ones(2, 8, 8).to_sparse(), 1.0))
    nested = torch.nested.nested_tensor([torch.ones(4), torch.ones(4)])  # layout: strided
    with pytest.raises(TypeError, match="x must be a dense tensor, got a nested tensor"):
        host.submit(fr.tasks.Saxpy(1.0, nested, torch.ones(8)))
    with pytest.raises(TypeError, match="images must be a dense tensor, got a nested tensor"):
        fr.tasks.Resize(nested, 4)
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


def test_flags_labels_and_sizes_of_the_wrong_type_are_refused(host):
    # bool("no") is True: record_times="no" turned recording on and cancel(wait="no")
    # waited; a numpy array raised numpy's ambiguity error naming no argument; a label
    # that is not a str was stored in the report as it was; a bare Task raised an empty
    # NotImplementedError.
    cases = [
        (lambda: fr.tasks.ItemCounter(4, 1, record_times="no"), "record_times must be a bool"),
        (lambda: fr.tasks.ItemCounter(4, 1, record_times=np.array([1, 2])), "record_times must"),
        (lambda: host.submit(fr.tasks.Spin(4, 100)).cancel(wait="no"), "wait must be a bool"),
        (lambda: host.compute(label=123), "label must be a str, got int"),
        (lambda: fr.Reserve(shared_memory=False), "reserve.shared_memory must be bytes"),
        (lambda: fr.Reserve(shared_memory=np.array([1, 2])), "reserve.shared_memory must be"),
        (lambda: host.submit(fr.tasks.Task()), "Task builds no side task"),
    ]
    for call, match in cases:
        with pytest.raises(TypeError, match=match):
            call()
    assert fr.tasks.ItemCounter(4, 1, record_times=np.bool_(True)).record_times is True


def test_a_saxpy_factor_past_float32s_range_is_refused_for_float32_arrays(host):
    # The kernels take `a` in the arrays' dtype: 1e39 was inf in float32, and so was y.
    with pytest.raises(ValueError, match="a must be within float32's range"):
        host.submit(fr.tasks.Saxpy(1e39, np.ones(4, np.float32), np.ones(4, np.float32)))
    y = np.ones(4)
    t = host.submit(fr.tasks.Saxpy(1e39, np.ones(4), y))  # float64 holds it
    assert t.wait(10) and t.state == "done" and y[0] == 1e39 + 1


def test_integrations_refuse_what_is_not_a_harvester():
    from freeride.integrations import deepspeed, megatron

    with pytest.raises(TypeError, match="h must be an fr.Harvester, got NoneType"):
        megatron.attach(None)
    with pytest.raises(TypeError, match="h must be an fr.Harvester, got str"):
        deepspeed.attach("cuda:0", object())
    h = fr.Harvester("cpu", workers=1)
    h.close()
    with pytest.raises(fr.HarvesterClosedError):
        megatron.attach(h)
