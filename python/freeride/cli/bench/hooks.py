"""What freeride's hooks cost the training thread: the host time of one close+open pair
around a compute action, through the calls users make, with the bubble record on.

Rows, one per way of calling the hooks, each over many recorded iterations of
`ACTIONS` compute actions:

- ``h.compute()``: a manual loop, ``with h.iteration():`` around ``with h.compute():``
  blocks that do nothing, each block timed from outside; the timer's own cost (a
  ``perf_counter_ns`` pair with nothing between) is subtracted.
- ``attach()``: a torch.distributed.pipelining schedule (one stage, gloo with world size
  1, ScheduleGPipe, `MICROBATCHES` microbatches: a forward, a loss and a backward
  compute action each) with freeride's hooks attached. A probe around the stage method
  that freeride wraps and another inside it time the wrapper from outside and the work
  from inside; the same two probes with nothing attached between them give the probes'
  own cost, subtracted. Needs torch with torch.distributed; without them the row says so.

On the host backend (``--mode cpu``) the gate writes and marks are the host backend's:
this is the real cost. ``--mode gpu`` runs the same rows on cuda:0 (torch's current
stream), where each pair also pays its C++ part: the stream-ordered writes, the event
records and, with a side task running, the launch an open enqueues (that last one is
`bench preempt`'s "launch at open host cost" row). No side task runs here: this is the
hooks' own cost. The CUDA path's Python part alone, measured without a GPU over a stub
executor, is `benchmarks/hook_cost.py` (it adds a row to this table).

Every `BETWEEN` iterations the loop asks `h.bubble_stats()` outside the timed blocks, as
the iterative runner and the job queue's agent do: the record resolves what the device
has passed, so the slots' predicted lengths change while the hooks run.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from freeride import Harvester

ACTIONS = 8  # compute actions per recorded iteration of the manual loop
MICROBATCHES = 4  # the attached schedule's: 3 compute actions each
BETWEEN = 16  # iterations between two bubble_stats() calls
LABELS = tuple(f"F{k}" for k in range(ACTIONS))


def measure(mode: str, quick: bool) -> dict[str, Any]:
    """The rows of both ways of calling the hooks on the host backend (cpu) or cuda:0."""
    iterations = 200 if quick else 4000
    steps = 20 if quick else 600
    device = "cpu" if mode == "cpu" else "cuda:0"
    backend = "host" if mode == "cpu" else "cuda"
    if mode == "gpu":
        with contextlib.suppress(ImportError):
            import torch  # noqa: F401 - the current stream is torch's, as in training
    floor = timer_floor_ns()
    rows = []
    with Harvester(device) as h:
        costs = pair_costs(
            lambda label: h.compute(label=label),
            h.iteration,
            iterations,
            between=lambda: h.bubble_stats(),
        )
        rows.append(row(backend, "h.compute()", "all", [c - floor for c in costs]))
    try:
        rows.append(_attach_row(device, backend, steps))
    except Exception as exc:  # noqa: BLE001 - the row says why; h.compute()'s stands
        # attach() to torch's pipelining runs on whatever torch the machine has: a failure
        # there must not lose the h.compute() row measured already (the metric's own).
        why = f"attach() failed: {type(exc).__name__}: {exc}"
        rows.append({"backend": backend, "hooks": "attach()", "unavailable": why})
    return {
        "rows": rows,
        "settings": {
            "actions_per_iteration": ACTIONS,
            "iterations": iterations,
            "attach_steps": steps,
            "attach_microbatches": MICROBATCHES,
            "timer_floor_ns": floor,
        },
        "notes": NOTES,
    }


NOTES = [
    (
        "per pair: the training thread's time in one close+open pair of the hooks (the"
        " gate closed before a compute action, reopened after it), bubble record on; ns"
    ),
    (
        "h.compute(): each empty block timed from outside, less the timer's own cost"
        " (settings.timer_floor_ns)"
    ),
    (
        "attach(): a probe outside the stage method freeride wraps and one inside it, less"
        " the same probes with nothing attached (one stage, ScheduleGPipe)"
    ),
    (
        "part all: everything the thread pays (host backend: the real cost; cuda: the"
        " Python part and the C++ part of writes and marks); no side task runs, so no"
        " open enqueues a launch (bench preempt's 'launch at open host cost' row)"
    ),
]


def timer_floor_ns(samples: int = 20_000) -> int:
    """The median of a ``perf_counter_ns`` pair with nothing between: what timing a block
    from outside adds to it."""
    clock = time.perf_counter_ns
    deltas = []
    for _ in range(samples):
        t0 = clock()
        deltas.append(clock() - t0)
    return int(np.median(deltas))


def pair_costs(
    compute: Callable[[str], Any],
    iteration: Callable[[], Any],
    iterations: int,
    actions: int = ACTIONS,
    between: Callable[[], Any] | None = None,
) -> list[int]:
    """Runs `iterations` recorded iterations (``with iteration():``) of `actions` empty
    compute blocks (``with compute(label):``) and returns each block's host time in ns,
    timer included. `between` runs every BETWEEN iterations, outside the timed blocks."""
    clock = time.perf_counter_ns
    costs: list[int] = []
    add = costs.append
    labels = (LABELS * (actions // len(LABELS) + 1))[:actions]
    gc.collect()  # not the garbage of whatever ran before (the collector stays on)
    for index in range(iterations):
        with iteration():
            for label in labels:
                t0 = clock()
                with compute(label):
                    pass
                add(clock() - t0)
        if between is not None and index % BETWEEN == BETWEEN - 1:
            between()
    return costs


def row(backend: str, hooks: str, part: str, costs_ns: list[int]) -> dict[str, Any]:
    """A table row of per-pair costs (ns): p50, p99 and mean over every pair measured."""
    arr = np.asarray(costs_ns, dtype=np.float64)
    return {
        "backend": backend,
        "hooks": hooks,
        "part": part,
        "pairs": int(arr.size),
        "p50_ns": round(float(np.percentile(arr, 50))),
        "p99_ns": round(float(np.percentile(arr, 99))),
        "mean_ns": round(float(arr.mean())),
    }


# -- attach() ------------------------------------------------------------------------------


def _attach_row(device: str, backend: str, steps: int) -> dict[str, Any]:
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    except ImportError as exc:
        return {"backend": backend, "hooks": "attach()", "unavailable": f"no torch ({exc})"}
    if not dist.is_available() or dist.is_initialized():
        why = "a process group exists" if dist.is_available() else "no torch.distributed"
        return {"backend": backend, "hooks": "attach()", "unavailable": why}
    with _one_rank_group(dist):
        torch.manual_seed(0)
        dev = torch.device(device)
        module = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()).to(dev)
        stage = PipelineStage(module, 0, 1, dev)
        schedule = ScheduleGPipe(
            stage, n_microbatches=MICROBATCHES, loss_fn=lambda o, t: ((o - t) ** 2).mean()
        )
        x = torch.randn(2 * MICROBATCHES, 16, device=dev)
        target = torch.randn(2 * MICROBATCHES, 16, device=dev)
        with Harvester(device) as h, _Probes(stage, schedule) as probes:
            schedule.step(x, target=target)  # torch's first step sets the stage up
            probes.spent[False].clear()
            # Alternating blocks of steps without and with the hooks, so that both see
            # the same load on a shared machine.
            blocks = 10
            for block in range(2 * blocks):
                attached = block % 2 == 1
                probes.install(
                    attached, functools.partial(h.attach, schedule) if attached else None
                )
                for index in range(max(1, steps // blocks)):
                    schedule.step(x, target=target)
                    if attached and index % BETWEEN == BETWEEN - 1:
                        h.bubble_stats()
                if attached:
                    h.detach()
    probe_ns = int(np.median(probes.spent[False]))
    return row(backend, "attach()", "all", [c - probe_ns for c in probes.spent[True]])


@contextlib.contextmanager
def _one_rank_group(dist: Any) -> Iterator[None]:
    """A gloo process group of this process alone, for the block."""
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


class _Probes:
    """Clocks around and inside the compute methods attach() wraps: an inner probe is
    installed first (attach() wraps it), an outer one over whatever is there then. The
    time outside the inner probe but inside the outer one is the wrapper's, plus the
    probes' own (measured with nothing attached between them)."""

    def __init__(self, stage: Any, schedule: Any) -> None:
        names = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
        self._targets = [(stage, n) for n in names if hasattr(stage, n)]
        self._targets.append((schedule, "_maybe_compute_loss"))
        self._own = {(id(obj), name): name in vars(obj) for obj, name in self._targets}
        self._originals = {(id(obj), name): getattr(obj, name) for obj, name in self._targets}
        self.attached = False
        self.spent: dict[bool, list[int]] = {False: [], True: []}
        self._inside = 0

    def __enter__(self) -> _Probes:  # noqa: PYI034 - typing.Self needs Python 3.11
        self.install(False, None)
        return self

    def install(self, attached: bool, attach: Callable[[], None] | None) -> None:
        """Inner probes on the methods, then `attach()` where given (it wraps them), then
        an outer probe over whatever is there; the pairs timed next count as `attached`."""
        for obj, name in self._targets:
            setattr(obj, name, self._inner(self._originals[(id(obj), name)]))
        if attach is not None:
            attach()
        for obj, name in self._targets:
            setattr(obj, name, self._outer(getattr(obj, name)))
        self.attached = attached

    def _inner(self, original: Callable) -> Callable:
        clock = time.perf_counter_ns

        def inner(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return original(*args, **kwargs)
            finally:
                self._inside = clock() - t0

        return inner

    def _outer(self, wrapped: Callable) -> Callable:
        clock = time.perf_counter_ns

        def outer(*args: Any, **kwargs: Any) -> Any:
            self._inside = 0
            t0 = clock()
            try:
                return wrapped(*args, **kwargs)
            finally:
                took = clock() - t0
                self.spent[self.attached].append(took - self._inside)

        return outer

    def __exit__(self, *exc: object) -> None:
        for obj, name in self._targets:
            if self._own[(id(obj), name)]:
                setattr(obj, name, self._originals[(id(obj), name)])
            else:
                delattr(obj, name)
