"""The measurement of tests/test_open_seen_first.py's GPU test, in a fresh process
(`python tests/open_seen_first_worker.py seen_first JSON-ARGS`, started by
gpu_worker.run_worker), which prints one line `RESULT {json}`.

Under one hardware queue a launch that waits on its stream holds everything behind it,
and before served_by_executor a launch at an open queued behind the executor's own launch
for the same open waited for good with time_slice=None, with training's next kernel and
close behind it. A process stuck so cannot exit cleanly (CUDA's teardown waits for the
same work), so the worker waits for training's kernel at most 5 s, then reports it stuck
and leaves with os._exit.

Nothing here imports torch or freeride at module level (see gpu_worker.py).
"""

from __future__ import annotations

import os
import time

from gpu_worker import serve_stuck_aware, wait_for


def mode_seen_first(args: dict) -> dict:
    """`opens` bubbles of `bubble_ms` with the GPU idle, each open's launch enqueued
    `delay_us` after its writes (the test switch), a Spin task of 20 us items running with
    time_slice=None: the executor (FREERIDE_ADMISSION=spin in the environment, looking all
    the time) sees each open take effect first and launches for it. After each bubble a
    close, a training kernel and a wait for it (5 s at most). Reports the launch counts,
    the items and whether training's kernel got stuck."""
    import torch

    import freeride as fr
    from freeride import _C

    opens = int(args.get("opens", 10))
    delay_us = int(args.get("delay_us", 3000))
    bubble_ms = float(args.get("bubble_ms", 5.0))
    torch.cuda.init()
    x = torch.ones(16, device="cuda")
    x.add_(1.0)  # loaded before any side work (a lazy load may synchronise the context)
    torch.cuda.synchronize()
    train = torch.cuda.current_stream()
    out: dict = {"connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")}
    with fr.Harvester("cuda:0", time_slice=None) as h:
        out["admission"] = h.admission
        out["launches_at_opens"] = h.launches_at_opens
        h.gate.close()  # one-time costs of stream-ordered writes, before side work
        h.gate.open()
        h.gate.close()
        train.synchronize()
        t = h.submit(fr.tasks.Spin(items=2**40, ns_per_item=20_000))
        time.sleep(0.05)  # admitted: its runner waits for an open
        _C._testing.delay_open_launch(delay_us)
        stuck_at = None
        try:
            for k in range(opens):
                h.gate.open()  # the GPU is idle: it takes effect at once
                time.sleep(bubble_ms / 1000)
                h.gate.close()
                x.add_(1.0)
                try:
                    wait_for(train.query, 5.0, "the training kernel", pause=0)
                except AssertionError:
                    stuck_at = k
                    break
        finally:
            _C._testing.delay_open_launch(0)
        counts = h.launch_counts()
        out.update(
            {
                "stuck_at": stuck_at,
                "served_by_executor": counts.served_by_executor,
                "launches": counts.launches,
                "at_opens": counts.at_opens,
                "items": int(t.items_done),
            }
        )
        if stuck_at is not None:
            # Nothing this process enqueues gets past the waiting launch any more: report
            # and leave without closing.
            out["exit_at_once"] = True
            return out
        t.cancel()
        t.wait(30)
    return out


MODES = {"seen_first": mode_seen_first}


if __name__ == "__main__":
    serve_stuck_aware(MODES)
