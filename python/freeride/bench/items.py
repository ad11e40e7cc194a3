"""Item overhead: throughput of a built-in task's preemptible kernel that is never paused,
against the same computation as a plain kernel (on the host backend: one item spanning
everything, which runs the same loop without the per-item protocol)."""

from __future__ import annotations

import time

import numpy as np

from .. import Harvester, tasks


def _timed(h: Harvester, task: tasks.Task, repeats: int) -> float:
    h.submit(task).wait()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        h.submit(task).wait()
    return (time.perf_counter() - t0) / repeats


def measure(mode: str, quick: bool) -> dict:
    return _cpu(quick) if mode == "cpu" else _gpu(quick)


def _cpu(quick: bool) -> dict:
    n = 1 << (20 if quick else 24)
    repeats = 3 if quick else 10
    rows = []
    with Harvester("cpu", workers=1) as h:
        for dtype in (np.float32, np.float64):
            x = np.random.default_rng(0).standard_normal(n).astype(dtype)
            y = np.zeros(n, dtype)
            plain = _timed(h, tasks.Saxpy(1e-3, x, y, chunk=n), repeats)
            items = _timed(h, tasks.Saxpy(1e-3, x, y), repeats)
            nbytes = 3 * x.nbytes
            rows.append(
                {
                    "task": f"Saxpy {np.dtype(dtype).name}",
                    "plain_GBps": nbytes / plain / 1e9,
                    "preemptible_GBps": nbytes / items / 1e9,
                    "item_overhead_pct": (items / plain - 1) * 100,
                }
            )
    return {"rows": rows, "settings": {"n": n, "repeats": repeats, "workers": 1}}


def _gpu(quick: bool) -> dict:
    import torch

    from .. import _C

    n = 1 << (24 if quick else 28)
    repeats = 5 if quick else 20
    rows = []
    stream = torch.cuda.Stream()
    with Harvester("cuda:0") as h:
        for dtype, code in ((torch.float32, 0), (torch.float64, 1)):
            x = torch.randn(n, device="cuda", dtype=dtype)
            y = torch.randn(n, device="cuda", dtype=dtype)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            _C.saxpy_plain(1e-3, x.data_ptr(), y.data_ptr(), n, code, stream.cuda_stream)
            start.record(stream)
            for _ in range(repeats):
                _C.saxpy_plain(1e-3, x.data_ptr(), y.data_ptr(), n, code, stream.cuda_stream)
            end.record(stream)
            end.synchronize()
            plain = start.elapsed_time(end) / 1000 / repeats
            items = _timed(h, tasks.Saxpy(1e-3, x, y), repeats)
            nbytes = 3 * x.numel() * x.element_size()
            rows.append(
                {
                    "task": f"Saxpy {str(dtype).replace('torch.', '')}",
                    "plain_GBps": nbytes / plain / 1e9,
                    "preemptible_GBps": nbytes / items / 1e9,
                    "item_overhead_pct": (items / plain - 1) * 100,
                }
            )
    return {
        "rows": rows,
        "settings": {"n": n, "repeats": repeats},
        "notes": ["preemptible: submit to done, host-timed (includes launch and readback)"],
    }
