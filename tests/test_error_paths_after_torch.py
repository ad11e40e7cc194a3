"""Every error path of the extension that formats a message, in a process that loaded torch
(and CuPy, where installed) first.

Regression test: a build that statically linked a second libstdc++ crashed formatting an
error message (std::ostream << unsigned long) once torch's libstdc++ was loaded, both on
the submitting thread (the memory-budget message) and on the executor's worker thread (a
failing task's message), and took the whole pytest run down. Each path therefore runs in a
child process: a crash there fails this test with the child's output instead of killing
pytest. The child prints one "ok <path>: ..." line per path it checked and "ALL OK" last.
"""

import os
import subprocess
import sys
import textwrap

import freeride as fr

# Paths the child checks on the host backend, which every machine has.
HOST_PATHS = [
    "host.budget.float32",
    "host.budget.float64",
    "host.task_failed_on_worker.x20",
    "host.raw_kernel_on_host_worker",
    "host.run_plain_failure",
    "host.cancelled",
    "host.cancelled_by_close",
    "host.closed.submit",
    "host.closed.gate_open",
    "host.closed.wait_all",
    "host.closed.raw_submit",
    "raw.spin_items_zero",
    "raw.spin_phases_zero",
    "raw.spin_overflow",
    "raw.saxpy_empty",
    "raw.saxpy_chunk_zero",
    "raw.saxpy_dtype",
    "raw.item_counter_null",
    "raw.pagerank_iters",
    "raw.pagerank_damping",
    "raw.blur_radius",
    "raw.image_dtype",
    "raw.resize_null",
    "raw.raw_kernel_block",
    "raw.raw_kernel_no_kernels",
    "raw.status_unknown_id",
    "raw.wait_unknown_id",
    "raw.cancel_unknown_id",
    "raw.elapsed_unknown_to",
    "raw.elapsed_unknown_from",
    "raw.executor_kind",
    "raw.executor_workers_zero",
    "raw.executor_workers_many",
    "raw.executor_cuda_unusable",
    "harvester.cuda7",
]
# Paths it checks on cuda:0 where a GPU and a CUDA build are present.
CUDA_PATHS = [
    "cuda.budget",
    "cuda.task_failed_on_worker.x20",
    "cuda.run_plain_failure",
    "cuda.cancelled",
    "cuda.cancelled_by_close",
    "cuda.elapsed_unknown_mark",
    "cuda.closed.mark",
    "cuda.closed.submit",
]

SCRIPT = textwrap.dedent(
    r"""
    import torch  # first: its libstdc++ is the one loaded when freeride's comes in

    try:
        import cupy  # noqa: F401
    except ImportError:
        pass

    import numpy as np

    import freeride as fr
    from freeride import _C


    def check(name, fn, exc, *needles):
        # fn() must raise `exc` with every needle in its message.
        try:
            fn()
        except exc as e:
            msg = str(e)
            missing = [n for n in needles if n not in msg]
            assert not missing, f"{name}: message {msg!r} lacks {missing}"
            print(f"ok {name}: {type(e).__name__}: {msg}", flush=True)
            return
        raise AssertionError(f"{name}: nothing was raised")


    def budget_paths(prefix, device, tensors):
        for suffix, budget, dtype, nbytes in tensors:
            with fr.Harvester(device, memory_budget=budget) as h:
                x = torch.ones(4096, dtype=dtype, device=h.device)
                y = torch.ones(4096, dtype=dtype, device=h.device)
                handle = h.submit(fr.tasks.Saxpy(2.0, x, y))
                check(
                    f"{prefix}.budget{suffix}",
                    lambda: handle.result(timeout=30),
                    fr.MemoryBudgetError,
                    "Saxpy",
                    f"needs {nbytes} bytes",
                    f"memory_budget of {budget} bytes",
                )
                assert handle.state == "failed", handle.state
                # The harvester stays usable: a task within the budget runs.
                small = h.submit(fr.tasks.Spin(4, 0))
                small.result(timeout=30)


    def failing_tasks(prefix, device, expected, **kwargs):
        # Many tasks failing on the executor's worker thread, one after the other.
        with fr.Harvester(device, **kwargs) as h:
            handles = []
            for i in range(20):
                at = (i % 2, (7 * i) % 64)
                handles.append((at, h.submit(fr.tasks.ItemCounter(64, phases=2, fail_at=at))))
            for at, handle in handles:
                needles = [n.format(phase=at[0], item=at[1]) for n in expected]
                try:
                    handle.result(timeout=30)
                except fr.TaskFailedError as e:
                    msg = str(e)
                    missing = [n for n in needles if n not in msg]
                    assert not missing, f"{prefix}: message {msg!r} lacks {missing}"
                else:
                    raise AssertionError(f"{prefix}: task failing at {at} succeeded")
                assert handle.state == "failed", handle.state
            h.submit(fr.tasks.Spin(4, 0)).result(timeout=30)  # still usable
        print(f"ok {prefix}.task_failed_on_worker.x20: TaskFailedError: {msg}", flush=True)


    def cancel_paths(prefix, device):
        with fr.Harvester(device) as h:
            # Closed now, not in stream order: a close queued on a CUDA stream could land
            # after the executor had already run the 10 us of Spin below.
            h.gate.close(stream="host")
            handle = h.submit(fr.tasks.Spin(10, 1000))
            handle.cancel()
            check(
                f"{prefix}.cancelled",
                lambda: handle.result(timeout=30),
                fr.TaskCancelledError,
                f"task {handle.id}",
                "cancelled",
            )
            queued = h.submit(fr.tasks.Spin(10, 1000))
        check(
            f"{prefix}.cancelled_by_close",
            lambda: queued.result(timeout=30),
            fr.TaskCancelledError,
            f"task {queued.id}",
            "the harvester was closed",
        )


    info = fr.backend_info()

    # -- host backend ---------------------------------------------------------------------

    budget_paths(
        "host",
        "cpu",
        [(".float32", 1000, torch.float32, 32768), (".float64", 12345, torch.float64, 65536)],
    )
    failing_tasks(
        "host",
        "cpu",
        ["ItemCounter", "injected failure at phase {phase}, item {item}"],
        workers=4,
    )

    with fr.Harvester("cpu", workers=2) as h:
        ex = h._ex
        # A RawKernel core reaching the host backend fails on the worker threads.
        core = _C.raw_kernel_task("RawKernel(k)", [(1, 8, 32, 0, 0)], 1, [])
        task_id = ex.submit(core, 0, [])
        assert ex.wait(task_id, 30.0)
        state, _, _, _, _, kind, msg = ex.status(task_id)
        assert state == "failed" and kind == 1, (state, kind, msg)
        assert "RawKernel(k)" in msg and "needs the cuda backend" in msg, msg
        print(f"ok host.raw_kernel_on_host_worker: status: {msg}", flush=True)

        # An item failing in run_plain raises on the calling thread.
        counts = np.zeros(8, np.uint32)
        done = np.zeros(1, np.uint64)
        violations = np.zeros(1, np.uint64)
        failing = _C.item_counter_task(
            8, 1, counts.ctypes.data, done.ctypes.data, violations.ctypes.data, 0, 0, 0, 5
        )
        check(
            "host.run_plain_failure",
            lambda: ex.run_plain(failing, 0),
            RuntimeError,
            "injected failure at phase 0, item 5",
        )

        # Unknown ids and marks.
        check(
            "raw.status_unknown_id", lambda: ex.status(12345), ValueError, "unknown task id 12345"
        )
        check(
            "raw.wait_unknown_id", lambda: ex.wait(12346, 0.0), ValueError, "unknown task id 12346"
        )
        check(
            "raw.cancel_unknown_id",
            lambda: ex.cancel(12347, False),
            ValueError,
            "unknown task id 12347",
        )
        check(
            "raw.elapsed_unknown_to",
            lambda: ex.elapsed_ns(999999, 999998),
            ValueError,
            "unknown mark",
            "999998",
        )
        mark = ex.mark(0)
        check(
            "raw.elapsed_unknown_from",
            lambda: ex.elapsed_ns(999997, mark),
            ValueError,
            "unknown mark 999997",
        )

    cancel_paths("host", "cpu")

    h = fr.Harvester("cpu", workers=1)
    ex = h._ex
    h.close()
    check(
        "host.closed.submit",
        lambda: h.submit(fr.tasks.Spin(1, 0)),
        fr.HarvesterClosedError,
        "closed",
    )
    check("host.closed.gate_open", lambda: h.gate.open(), fr.HarvesterClosedError, "closed")
    check("host.closed.wait_all", lambda: h.wait_all(), fr.HarvesterClosedError, "closed")
    check(
        "host.closed.raw_submit",
        lambda: ex.submit(_C.spin_task(1, 1, 0), 0, []),
        RuntimeError,
        "the harvester is closed",
    )

    # -- the raw _C layer with arguments the Python layer would have refused --------------

    check(
        "raw.spin_items_zero",
        lambda: _C.spin_task(0, 1, 10),
        ValueError,
        "items must be positive, got 0",
    )
    check(
        "raw.spin_phases_zero",
        lambda: _C.spin_task(5, 0, 10),
        ValueError,
        "phases must be positive, got 0",
    )
    check("raw.spin_overflow", lambda: _C.spin_task(2**63, 4, 10), ValueError, "overflows 64 bits")
    # n = 0 gives zero items, which the base class reports first.
    check(
        "raw.saxpy_empty",
        lambda: _C.saxpy_task(1.0, 8, 16, 0, 10, 0),
        ValueError,
        "must be positive, got 0",
    )
    check(
        "raw.saxpy_chunk_zero",
        lambda: _C.saxpy_task(1.0, 8, 16, 10, 0, 0),
        ValueError,
        "chunk must be positive, got 0",
    )
    check(
        "raw.saxpy_dtype",
        lambda: _C.saxpy_task(1.0, 8, 16, 10, 10, 7),
        ValueError,
        "dtype",
        "got 7",
    )
    check(
        "raw.item_counter_null",
        lambda: _C.item_counter_task(4, 1, 0, 0, 0, 0, 0, -1, -1),
        ValueError,
        "counter buffers must not be null",
    )
    ptrs = [8] * 7
    check(
        "raw.pagerank_iters",
        lambda: _C.pagerank_task(10, *ptrs, 0, 0.85, 1),
        ValueError,
        "iters must be positive, got 0",
    )
    check(
        "raw.pagerank_damping",
        lambda: _C.pagerank_task(10, *ptrs, 3, 1.5, 1),
        ValueError,
        "damping must be in [0, 1], got 1.5",
    )
    check(
        "raw.blur_radius",
        lambda: _C.gaussian_blur_task(1, 4, 4, 0, 8, 8, 8, 8, -1, 1),
        ValueError,
        "GaussianBlur: radius must be >= 0",
    )
    check(
        "raw.image_dtype",
        lambda: _C.gaussian_blur_task(1, 4, 4, 5, 8, 8, 8, 8, 1, 1),
        ValueError,
        "image dtype must be 0",
    )
    check(
        "raw.resize_null",
        lambda: _C.resize_task(1, 4, 4, 2, 2, 0, 0, 8, 1),
        ValueError,
        "Resize: buffers must not be null",
    )
    check(
        "raw.raw_kernel_block",
        lambda: _C.raw_kernel_task("k", [(1, 10, 2000, 0, 0)], 1, []),
        ValueError,
        "block must be in [1, 1024], got 2000",
    )
    check(
        "raw.raw_kernel_no_kernels",
        lambda: _C.raw_kernel_task("k", [], 1, []),
        ValueError,
        "at least one kernel",
    )
    check(
        "raw.executor_kind",
        lambda: _C.Executor("banana", 0, 1, False, False, 0, (0, 1, 0, 0), 0),
        ValueError,
        "'banana'",
    )
    check(
        "raw.executor_workers_zero",
        lambda: _C.Executor("host", -1, 0, False, False, 0, (0, 1, 0, 0), 0),
        ValueError,
        "workers must be in [1, 1024], got 0",
    )
    check(
        "raw.executor_workers_many",
        lambda: _C.Executor("host", -1, 5000, False, False, 0, (0, 1, 0, 0), 0),
        ValueError,
        "got 5000",
    )
    # No CUDA here: device 0 is unusable (a build without CUDA, or no driver or GPU).
    # With a GPU: an index past the last device.
    bad = len(info["devices"]) + 90 if info["cuda"] else 0
    check(
        "raw.executor_cuda_unusable",
        lambda: _C.Executor("cuda", bad, 1, False, False, 0, (0, 1, 0, 0), 0),
        (RuntimeError, ValueError),
        "CUDA",
        str(bad),
    )
    bad = max(7, len(info["devices"]))
    check(
        "harvester.cuda7",
        lambda: fr.Harvester(f"cuda:{bad}"),
        (fr.CudaUnavailableError, ValueError),
        str(bad),
    )

    # -- cuda:0 ---------------------------------------------------------------------------

    if not info["cuda"]:
        print(f"skipped cuda paths: {info['reason'] or 'no usable CUDA device'}", flush=True)
    elif not torch.cuda.is_available():
        print("skipped cuda paths: torch has no CUDA", flush=True)
    else:
        budget_paths("cuda", "cuda:0", [("", 1000, torch.float32, 32768)])
        failing_tasks(
            "cuda", "cuda:0", ["ItemCounter", "injected failures run on the host backend only"]
        )
        with fr.Harvester("cuda:0") as h:
            ex = h._ex
            counts = torch.zeros(8, dtype=torch.int32, device="cuda:0")
            done = torch.zeros(1, dtype=torch.int64, device="cuda:0")
            violations = torch.zeros(1, dtype=torch.int64, device="cuda:0")
            failing = _C.item_counter_task(
                8, 1, counts.data_ptr(), done.data_ptr(), violations.data_ptr(), 0, 0, 0, 5
            )
            check(
                "cuda.run_plain_failure",
                lambda: ex.run_plain(failing, h.side_stream),
                RuntimeError,
                "injected failures run on the host backend only",
            )
            check(
                "cuda.elapsed_unknown_mark",
                lambda: ex.elapsed_ns(999999, 999998),
                ValueError,
                "unknown mark",
                "999999",
                "999998",
            )
        check("cuda.closed.mark", lambda: ex.mark(0), RuntimeError, "shut down")
        check(
            "cuda.closed.submit",
            lambda: ex.submit(_C.spin_task(1, 1, 0), 0, []),
            RuntimeError,
            "the harvester is closed",
        )
        check(
            "cuda.reserve_too_big",
            lambda: fr.Harvester("cuda:0", reserve=fr.Reserve(blocks=4)),
            ValueError,
            "leaves no room for side work",
        )
        cancel_paths("cuda", "cuda:0")
        torch.cuda.synchronize()

    print("ALL OK", flush=True)
    """
)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def test_error_paths_after_torch_import():
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output = f"--- stdout ---\n{_tail(proc.stdout)}\n--- stderr ---\n{_tail(proc.stderr)}"
    # A negative returncode is the signal that killed the child (-11: a segfault).
    assert proc.returncode == 0, f"child exited with {proc.returncode}\n{output}"
    assert "ALL OK" in proc.stdout, output

    checked = {
        line[3:].split(":", 1)[0] for line in proc.stdout.splitlines() if line.startswith("ok ")
    }
    expected = list(HOST_PATHS)
    if fr.backend_info()["cuda"] and "skipped cuda paths:" not in proc.stdout:
        expected += CUDA_PATHS
    else:
        assert "skipped cuda paths:" in proc.stdout, output
        assert not checked & set(CUDA_PATHS), output
    missing = [name for name in expected if name not in checked]
    assert not missing, f"the child checked no {missing}\n{output}"
