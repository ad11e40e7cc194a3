"""What freeride's hooks cost the training thread per close+open pair: `freeride bench
hooks`' rows, plus the CUDA path's Python part measured without a GPU.

    python benchmarks/hook_cost.py [--quick] [--mode cpu|gpu] [--out result.json]

`freeride bench hooks` times the hooks through the calls users make, on the host backend
(the real cost there) or on cuda:0. This script adds rows for the recorder and its gate
made as on a GPU (kind "cuda") over a stub executor: the executor's calls
(gate_write_marked, which also asks whether the stream is being captured, release_mark,
elapsed_ns, running_item_ns, ...), torch's current-stream lookup and the free-memory query
(cudaMemGetInfo) all return at once, so what is left is the Python part alone. The C++
part of a pair (the capture query, the stream-ordered writes, the event records and, with
a side task running, the launch an open enqueues) is measured on a GPU: `freeride bench preempt
--mode gpu`'s "close+open host cost" and "launch at open host cost" rows, and `freeride
bench hooks --mode gpu`.

With `--mode gpu` it also times each kind of CUDA call that pair makes, one kind at a
time, on a stream of cuda:0 that a stream wait holds meanwhile, as the host's lead holds
a training stream (`_C.measure_call_costs`, csrc/cuda/call_costs.hpp; hooks "CUDA call"):
the device guard, the capture query, the relaxed capture scope and the event record of
every mark, the watcher's event record at every open, the gate's batch of writes, and
what a launch at an open adds (the wait for the open's event, the launch, the context
kept). Their sum is no pair's cost (a pair makes some of them twice, some not at all, and
holds locks between), but each says what removing one call would save.

A script, not a `freeride bench` mode: the stub and the call rows reach below the
package's public face (the recorder, the gate's module-level queries, `_C`), which the
freeride command may not (tests/test_layers.py).

The stub's bubbles are 100 µs long (its marks are 100 µs apart), so once the slots'
lengths are known every open goes through the whole launch decision (the 50 µs floor,
then the running task's item time), as long bubbles on a GPU do.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

from freeride.cli.bench import hooks

STUB_STREAM = 0x7F00_0000_1000  # the handle torch's current stream "is" in the stub
STUB_MARK_NS = 100_000  # time between two of the stub's marks

STUB_NOTES = [
    (
        "cuda stub: the recorder and gate of kind 'cuda' over a stub executor; the"
        " executor's calls (the capture query is one of them), torch's current-stream"
        " lookup and the free-memory query return at once: the Python part only"
    ),
    (
        "the C++ part (the capture query, stream-ordered writes, event records, the launch"
        " an open enqueues)"
        " is measured on a GPU: bench preempt's 'close+open host cost' and 'launch at open"
        " host cost' rows, and bench hooks --mode gpu"
    ),
    (
        "cuda stub Recorder.compute(): with rec.compute(label) blocks inside"
        " rec.iteration(), as h.compute() runs them (less the Harvester's own check);"
        " attach() wrapper: the stage-method wrapper attach() places, around a method that"
        " returns at once, less the timer and a bare call of that method"
    ),
]


class StubExecutor:
    """Answers every call the recorder and gate make of an executor at once."""

    running_item_ns = 0  # no item time measured: the 50 µs floor alone decides

    def __init__(self) -> None:
        self._next = 0

    def set_recording(self, on: bool) -> None:
        pass

    def mark(self, stream: int) -> int:
        self._next += 1
        return self._next

    def gate_write(self, value: int, stream: int, seq: int, launch: bool = True) -> None:
        pass

    def gate_write_marked(self, value: int, stream: int, seq: int, launch: bool = True) -> int:
        self._next += 1
        return self._next

    def release_mark(self, mark: int) -> None:
        pass

    def elapsed_ns(self, from_mark: int, to_mark: int) -> int:
        return (to_mark - from_mark) * STUB_MARK_NS

    def mark_unix_ns(self, mark: int, timeout: float) -> int:
        return mark * STUB_MARK_NS  # the report's clock origin: any fixed clock serves

    def take_launch_log(self) -> list:
        return []

    def wait_launches_taken(self, timeout: float) -> bool:
        return True


@contextlib.contextmanager
def stubbed_queries() -> Iterator[None]:
    """The queries the gate and recorder make outside the executor, answered at once:
    torch's current stream (wherever the gate looks it up) and free device memory. Put
    back as they were after the block."""
    from freeride import _streams, gate
    from freeride.record import recorder

    stubs = [
        (recorder, "free_device_memory", lambda device: 0),
    ]
    for module in (_streams, gate):
        if hasattr(module, "current_stream"):
            stubs.append((module, "current_stream", lambda device: STUB_STREAM))
    saved = [(module, name, getattr(module, name)) for module, name, _ in stubs]
    try:
        for module, name, stub in stubs:
            setattr(module, name, stub)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def stub_rows(quick: bool) -> list[dict[str, Any]]:
    """The cuda-kind rows: Recorder.compute() and attach()'s wrapper over the stub."""
    from freeride.attach import _compute_wrapper, _label
    from freeride.gate import Gate
    from freeride.record.recorder import Recorder

    iterations = 200 if quick else 4000
    floor = hooks.timer_floor_ns()
    rows = []
    with stubbed_queries():
        ex = StubExecutor()
        rec = Recorder(Gate(ex, "cuda", 0, lambda: None), ex, "cuda", 0)
        flush = functools.partial(rec.flush, block=False)
        costs = hooks.pair_costs(rec.compute, rec.iteration, iterations, between=flush)
        rows.append(
            hooks.row("cuda stub", "Recorder.compute()", "Python", [c - floor for c in costs])
        )

        ex = StubExecutor()
        rec = Recorder(Gate(ex, "cuda", 0, lambda: None), ex, "cuda", 0)
        stage = _StandInStage()
        method = stage.forward_one_chunk
        wrapped = _compute_wrapper(rec, functools.partial(_label, "F", stage))(method)
        bare = _call_costs(method, iterations // 8)
        base = int(sorted(bare)[len(bare) // 2])
        costs = _call_costs(wrapped, iterations, rec.iteration, rec.flush)
        rows.append(hooks.row("cuda stub", "attach() wrapper", "Python", [c - base for c in costs]))
    return rows


CALL_NOTES = [
    (
        "CUDA call: the host time of one call of each kind a pair makes, calls_per_kind of"
        " each on a stream of cuda:0 held by a stream wait while they are timed"
        " (settings.calls_held; false: no stream memory operations, nothing held), less"
        " the clock's own floor (settings.call_timer_floor_ns); what removing one call"
        " would save, not parts that add up to a pair"
    ),
]


def call_rows(quick: bool, device: int = 0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The "CUDA call" rows (one per kind of call, floor subtracted) and their settings."""
    from freeride import _C

    calls = 256 if quick else 4096
    try:
        measured = _C.measure_call_costs(device, calls)
    except Exception as exc:  # noqa: BLE001 - any failure is this row's, not the run's
        why = f"{type(exc).__name__}: {exc}"
        return [{"backend": "cuda", "hooks": "CUDA call", "unavailable": why}], {}
    floor_row, *kinds = measured["calls"]
    floor = int(sorted(floor_row["ns"])[len(floor_row["ns"]) // 2])
    rows = []
    for kind in kinds:
        if kind["unavailable"]:
            rows.append(
                {
                    "backend": "cuda",
                    "hooks": "CUDA call",
                    "part": kind["call"],
                    "unavailable": kind["unavailable"],
                }
            )
        else:
            rows.append(
                hooks.row("cuda", "CUDA call", kind["call"], [c - floor for c in kind["ns"]])
            )
    settings = {
        "calls_per_kind": calls,
        "calls_held": measured["held"],
        "call_timer_floor_ns": floor,
    }
    return rows, settings


class _StandInStage:
    """What attach()'s wrapper reads of a pipeline stage (its label), and a compute
    method that returns at once."""

    stage_index = 0

    def forward_one_chunk(self, chunk: int, *args: Any, **kwargs: Any) -> None:
        return None


def _call_costs(call: Any, iterations: int, iteration: Any = None, flush: Any = None) -> list[int]:
    """Host time in ns of `call(chunk)`, hooks.ACTIONS calls an iteration (each inside
    ``with iteration():`` where given), timer included; `flush(block=False)` every
    hooks.BETWEEN iterations, outside the timed calls."""
    clock = time.perf_counter_ns
    costs: list[int] = []
    add = costs.append
    gc.collect()  # not the garbage of whatever ran before (the collector stays on)
    for index in range(iterations):
        with iteration() if iteration is not None else contextlib.nullcontext():
            for chunk in range(hooks.ACTIONS):
                t0 = clock()
                call(chunk)
                add(clock() - t0)
        if flush is not None and index % hooks.BETWEEN == hooks.BETWEEN - 1:
            flush(block=False)
    return costs


def run(mode: str = "cpu", quick: bool = False, out: str | None = None) -> dict[str, Any]:
    """`freeride bench hooks`' result with the stub's rows added; printed, and written
    as JSON at `out`."""
    from freeride.cli import bench

    result = bench.header("hooks", mode, quick)
    result.update(hooks.measure(mode, quick))
    result["rows"] += stub_rows(quick)
    result["notes"] = [*result["notes"], *STUB_NOTES]
    if mode == "gpu":
        # Kept before the CUDA calls are timed: a measurement killed by its deadline
        # leaves the rows measured so far.
        _write(result, out)
        rows, settings = call_rows(quick)
        result["rows"] += rows
        result["settings"].update(settings)
        result["notes"] = [*result["notes"], *CALL_NOTES]
    print(bench.format_table(result))
    _write(result, out)
    return result


def _write(result: dict[str, Any], out: str | None) -> None:
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--quick", action="store_true", help="small sizes (the smoke test)")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    run(args.mode, args.quick, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
