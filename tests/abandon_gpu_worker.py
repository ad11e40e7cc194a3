"""GPU measurements of what a close that leaves launches on the GPU keeps, and when it
lets go (review G5, G7), each in a fresh process: `python tests/abandon_gpu_worker.py
MODE JSON-ARGS` prints `RESULT {json}` (see gpu_worker.py, whose runner and helpers this
uses). Nothing imports torch or freeride at module level."""

from __future__ import annotations

import gc
import time
import warnings

from gpu_worker import CYCLES_PER_MS, serve, wait_for


def _kept_slabs(device: int) -> int:
    from freeride import _C

    return _C._testing.kept_slabs(device, False, 0) + _C._testing.kept_slabs(device, True, 0)


def mode_held_slabs(args: dict) -> dict:
    """A harvester closed while its streams read busy (the test switch): its slabs must
    go to no later pool while held, and to the keep once reclaimed."""
    import torch

    import freeride as fr
    from freeride import _C, _abandoned

    torch.ones(1, device="cuda").cpu()
    h = fr.Harvester("cuda:0", reserve=fr.Reserve(mechanism=args["mechanism"]))
    t = h.submit(fr.tasks.Spin(64, 1000))
    assert t.wait(30), "the task did not finish"
    before = _kept_slabs(0)
    kept_executors = _abandoned.kept()
    _C._testing.streams_never_idle(True)
    try:
        h.close()
        del h, t
        gc.collect()
        held = _kept_slabs(0)
        executors_held = _abandoned.kept()
        still_held = _abandoned.release_passed()
    finally:
        _C._testing.streams_never_idle(False)
    released = _abandoned.release_passed()
    gc.collect()
    return {
        "before": before,
        "held": held,
        "after": _kept_slabs(0),
        "executors_before": kept_executors,
        "executors_held": executors_held,
        "still_held": still_held,
        "released": released,
    }


def mode_abandon_queued(args: dict) -> dict:
    """A launch at an open queued behind `hold_ms` of training's work (in the green
    context with the default reserve), and close with a short deadline: close returns
    by about the deadline, abandoning it; CUDA works afterwards; once the training stream
    has got through and the launch has run, what was held for it is let go."""
    import torch

    import freeride as fr
    from freeride import _abandoned

    torch.ones(1, device="cuda").cpu()
    train = torch.cuda.Stream()
    h = fr.Harvester("cuda:0", reserve=fr.Reserve(mechanism=args["mechanism"]))
    mechanism = h.reserve_mechanism
    t = h.submit(fr.tasks.Spin(10**9, 10_000))
    wait_for(lambda: t.items_done > 0, 30, "side work started")
    h.gate.close(stream="host")
    with torch.cuda.stream(train):
        torch.cuda._sleep(int(args["hold_ms"] * CYCLES_PER_MS))
        h.gate.open(stream=train)  # carries a launch, queued behind the sleep
        h.gate.close(stream=train)
    kept = _abandoned.kept()
    h._parts.deadline = args["deadline"]
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h.close()
    close_s = time.perf_counter() - started
    state, kept_after_close = t.state, _abandoned.kept()
    started = time.perf_counter()
    train.synchronize()
    x = torch.ones(1 << 20, device="cuda")
    context_ok = float(x.sum()) == float(1 << 20)
    drained_s = time.perf_counter() - started
    wait_for(lambda: _abandoned.release_passed() <= kept, 10, "abandoned launch reclaimed")
    return {
        "mechanism": mechanism,
        "close_s": close_s,
        "state": state,
        "warned": sum("abandoned" in str(w.message) for w in caught),
        "kept_before": kept,
        "kept_after_close": kept_after_close,
        "drained_s": drained_s,
        "context_ok": context_ok,
    }


MODES = {"held_slabs": mode_held_slabs, "abandon_queued": mode_abandon_queued}


if __name__ == "__main__":
    serve(MODES)
