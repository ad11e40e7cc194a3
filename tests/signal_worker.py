"""Child process of test_signals.py: a training loop with a harvester, which the test
interrupts with SIGINT or SIGTERM.

usage: signal_worker.py OUT MODE

MODE "loop": a torch training loop on the host backend, every compute action in
``h.compute()`` inside ``h.iteration()``, with an item task (Spin, then an ItemCounter
that is still running when the signal comes) and an iterative task in its bubbles.
MODE "queue": the same loop with a one-rank fr.JobQueue (gloo) around it, and a task
placed through the queue that runs to its end, and one still waiting on the rank.
MODE "wait": the main thread blocked in ``handle.wait()`` on a task that never ends.
MODE "stuck": a harvester open and the main thread blocked in native code that never
returns and never runs Python's signal handlers (an unresolved torch future).

Prints one line "ready {json}" once side work has run (the json: freeride's threads then).
Once freeride's shutdown is over (SIGINT: the with-block has been left; SIGTERM: from
freeride._shutdown's handler, just before the process kills itself) it writes OUT: when
(time.monotonic(), comparable with the parent's), the freeride threads still alive, and
the ItemCounter's per-item counts.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import freeride as fr
from freeride import _shutdown


def os_thread_names() -> list[str]:
    """Every thread of this process as the OS names it: C++ threads included."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # exited meanwhile
            pass
    return names


def freeride_threads() -> dict[str, list[str]]:
    me = threading.current_thread()
    return {
        "python": sorted(
            t.name for t in threading.enumerate() if t.name.startswith("freeride") and t is not me
        ),
        "os": sorted(n for n in os_thread_names() if n.startswith("freeride")),
    }


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    # Ctrl-C as a terminal delivers it, whoever started the suite: a shell without job
    # control (a script's `cmd &`, CI runners, batch systems) starts background commands
    # with SIGINT ignored, every process below inherits that, and Python then installs no
    # KeyboardInterrupt handler, so the signal the test sends would be dropped.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    state: dict = {}

    def report() -> None:
        data = {"done_at": time.monotonic(), "threads": freeride_threads()}
        counter, handle = state.get("counter"), state.get("handle")
        if counter is not None:
            counts = counter.snapshot().counts
            data.update(
                max_count=int(counts.max()),
                counted=int(counts.sum()),
                items_done=handle.items_done,
                state=handle.state,
            )
        with open(out + ".part", "w") as f:
            json.dump(data, f)
        os.replace(out + ".part", out)

    def ready() -> None:
        print("ready " + json.dumps(freeride_threads()), flush=True)

    _shutdown._after_sigterm.append(report)  # SIGTERM: the process leaves no other trace
    before = freeride_threads()
    assert before == {"python": [], "os": []}, before
    try:
        if mode == "wait":
            with fr.Harvester("cpu", workers=1) as h:
                spin = h.submit(fr.tasks.Spin(items=10**9, ns_per_item=20_000))
                ready()
                spin.wait()
        elif mode == "stuck":
            import torch

            with fr.Harvester("cpu", workers=1) as h:
                h.submit(fr.tasks.Spin(items=10**9, ns_per_item=20_000))
                ready()
                torch.futures.Future().wait()
        else:
            train(state, ready, with_queue=mode == "queue")
    except KeyboardInterrupt:
        report()
        raise


def train(state: dict, ready, with_queue: bool) -> None:
    import contextlib
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Steps(fr.IterativeTask):
        """A small model's training steps, run in bubbles by the iterative runner."""

        def setup(self) -> None:
            self.w = torch.randn(16, 16, requires_grad=True)
            self.steps = 0

        def step(self) -> None:
            loss = torch.tanh(self.w @ self.w).square().mean()
            loss.backward()
            with torch.no_grad():
                self.w -= 0.01 * self.w.grad
                self.w.grad = None
            self.steps += 1

        def finished(self) -> bool:
            return False

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    counter = fr.tasks.ItemCounter(items=1_000_000, ns_per_item=20_000)
    steps = Steps()
    announced = False
    with contextlib.ExitStack() as stack:
        h = stack.enter_context(fr.Harvester("cpu", workers=2))
        placed = None
        if with_queue:
            dist.init_process_group(
                "gloo",
                store=dist.HashStore(),
                rank=0,
                world_size=1,
                timeout=timedelta(seconds=30),
            )
            q = stack.enter_context(fr.JobQueue(h, host="127.0.0.1"))
            # One placed task runs to the end first (most urgent); another waits behind
            # the harvester's own tasks and is handed back when the queue is left.
            spec = fr.TaskSpec(fr.tasks.Spin, kwargs={"items": 300, "ns_per_item": 20_000})
            placed = q.submit(spec, priority=3)
            q.submit(fr.TaskSpec(fr.tasks.Spin, kwargs={"items": 10**9, "ns_per_item": 20_000}))
        # Spin first (most urgent, short), then the ItemCounter, which is still running
        # when the signal comes; the iterative task beside them on its own thread.
        spin = h.submit(fr.tasks.Spin(items=200, ns_per_item=20_000), priority=2)
        state["handle"] = h.submit(counter, priority=1)
        state["counter"] = counter
        h.submit(steps)
        while True:
            with h.iteration():
                with h.compute(label="forward"):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                time.sleep(0.002)  # a bubble: waiting for a neighbour stage
                with h.compute(label="backward"):
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                time.sleep(0.001)
            if (
                not announced
                and (placed is None or placed.state == "done")
                and spin.state == "done"
                and state["handle"].items_done >= 20
                and getattr(steps, "steps", 0) >= 2
            ):
                ready()
                announced = True


if __name__ == "__main__":
    main()
