"""`freeride bench NAME`: the benchmarks, each with a GPU mode and a small CPU mode.

Every benchmark returns a dict of what it measured; `run()` adds the device, date,
commit and settings, writes it as JSON and prints a table. Nothing is hard-coded: a
number in the output is a number that was measured in this run.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

from freeride import __version__, backend_info

# CUDA source of now(): the device's nanosecond clock (%globaltimer), one for every SM, so
# stamps taken by different kernels and streams compare. The GPU benchmarks' kernels use it.
DEVICE_CLOCK_SRC = r"""
__device__ __forceinline__ unsigned long long now() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
"""

# Kernels on that clock that several benchmarks and GPU tests launch; a module's source is
# DEVICE_CLOCK_SRC once, then any of these, then its own kernels.
# stamp: *out = the time it ran (launch one thread). probe: starts[b] = when block b
# started (thread 0 of each block; dynamic shared memory, if given, is left unused).
STAMP_SRC = r"""
extern "C" __global__ void stamp(unsigned long long* out) { *out = now(); }
"""
PROBE_SRC = r"""
extern "C" __global__ void probe(unsigned long long* starts) {
  if (threadIdx.x == 0) starts[blockIdx.x] = now();
}
"""
# marker: holds its stream until the host, having enqueued what follows it, sets *go
# (pinned memory), spins after_ns more and stamps out[0] as it ends (0: no flag within
# timeout_ns). What follows it then reaches the GPU already queued: a delay measured from
# the stamp leaves out the host's enqueue calls (launch one thread; the benchmarks pass
# MARKER_AFTER_GO_NS and MARKER_TIMEOUT_NS).
MARKER_SRC = r"""
extern "C" __global__ void marker(const volatile unsigned int* go, unsigned long long* out,
                                  unsigned long long timeout_ns, unsigned long long after_ns) {
  const unsigned long long t0 = now();
  while (*go == 0u) {
    if (now() - t0 > timeout_ns) { out[0] = 0ull; return; }
  }
  const unsigned long long t1 = now();
  while (now() - t1 < after_ns) {}
  out[0] = now();
}
"""

MARKER_AFTER_GO_NS = 5_000  # after the flag: what the host enqueued is in the GPU's queue
MARKER_TIMEOUT_NS = 1_000_000_000

BENCHMARKS = ("preempt", "items", "pipeline", "ranks", "soak", "hooks")


def _commit() -> str:
    env = os.environ.get("FREERIDE_COMMIT")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        ["git", "-C", here, "rev-parse", "--short", "HEAD"],
        check=False,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or "unknown"


def _device_name(mode: str) -> str:
    if mode == "cpu":
        return f"{platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)"
    return backend_info()["devices"][0]["name"]


def header(name: str, mode: str, quick: bool) -> dict[str, Any]:
    """What every result starts with: the benchmark, where and when it ran, and on which
    commit (benchmarks/hook_cost.py adds rows to a result of its own)."""
    return {
        "benchmark": name,
        "mode": mode,
        "device": _device_name(mode),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),
        "freeride": __version__,
        "quick": quick,
    }


def run(
    name: str,
    mode: str = "auto",
    out: str | None = None,
    quick: bool = False,
    plot: str | None = None,
    options: dict[str, Any] | None = None,
) -> dict:
    """Runs benchmark `name` on the GPU (mode "gpu"), the host backend ("cpu") or
    whichever is present ("auto"); returns and optionally writes the result (JSON at
    `out`, a PNG at `plot` where the benchmark draws one). `options`: keyword arguments
    of the benchmark's own measure() (soak: minutes)."""
    if name not in BENCHMARKS:
        raise ValueError(f"benchmark must be one of {BENCHMARKS}, got {name!r}")
    module = __import__(f"{__name__}.{name}", fromlist=["measure"])
    modes: tuple[str, ...] = getattr(module, "MODES", ("cpu", "gpu"))
    if mode == "auto":
        info = backend_info()
        mode = "gpu" if info["cuda"] and "gpu" in modes else "cpu"
        if mode == "cpu" and info.get("gpu_unused"):
            print(f"note: running on the CPU: {info['gpu_unused']}")
    if mode not in ("cpu", "gpu"):
        raise ValueError(f"mode must be 'auto', 'cpu' or 'gpu', got {mode!r}")
    if mode not in modes:
        raise ValueError(f"benchmark {name!r} runs in mode {' or '.join(modes)} only")
    if mode == "gpu" and not backend_info()["cuda"]:
        raise RuntimeError(f"no usable GPU: {backend_info()['reason']}")
    measure: Callable[..., dict] = module.measure
    options = dict(options or {})
    if options:
        import inspect

        accepted = set(inspect.signature(measure).parameters) - {"mode", "quick"}
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise ValueError(f"benchmark {name!r} takes no option {', '.join(unknown)}")
    result = header(name, mode, quick)
    result.update(measure(mode, quick, **options))
    print(format_table(result))
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
    if plot:
        if not hasattr(module, "plot"):
            raise ValueError(f"benchmark {name!r} draws no plot")
        module.plot(result, plot)
    return result


def format_table(result: dict) -> str:
    """The result's rows (a list of flat dicts) as an aligned text table."""
    rows = result.get("rows", [])
    head = (
        f"{result['benchmark']} on {result['device']} ({result['mode']}), commit {result['commit']}"
    )
    if not rows:
        return head
    cols = list(dict.fromkeys(key for row in rows for key in row))  # every row's, in order
    cells = [[_fmt(row.get(c)) for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    lines = [head, "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    for note in result.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """The environment with `values` set for the block, as it was after: for settings a
    harvester reads when it is made (FREERIDE_GATE_WRITE, FREERIDE_LAUNCH_AT_OPEN, ...)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def percentiles(values_us: list[float]) -> dict[str, float]:
    """p50, p99, max and mean of a list of microseconds."""
    import numpy as np

    arr = np.asarray(values_us, dtype=np.float64)
    return {
        "p50_us": float(np.percentile(arr, 50)),
        "p99_us": float(np.percentile(arr, 99)),
        "max_us": float(arr.max()),
        "mean_us": float(arr.mean()),
    }
