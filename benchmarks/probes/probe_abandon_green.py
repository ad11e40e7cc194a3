"""Does destroying the green context wait for the GPU, or break CUDA, when a launch is still
queued in it? (review 2026-11-26, G7)

    python3 probe_abandon_green.py

Shutdown destroys the harvester's green context (cuGreenCtxDestroy) after its streams,
also when close() abandoned launches still queued there. What the driver does then is
undocumented: if it synchronises, close() waits for the GPU (for ever behind a dead peer:
the close deadline, F9, is void); if it does not, the queued kernel may run in a context
that no longer exists.

Two parts, each with the default reserve (a green context; a fallback to the occupancy
cap is reported, and then the probe does not test G7):

1. Normal path: a Spin task runs with the gate open while another stream B holds ~2 s of
   GPU work that has nothing to do with the harvester; close() is timed. Near 0 s: the
   destroy does not wait for the device. About B's remaining time: it waits for the
   device (close would wait for training's queued work: the cudaFree symptom again).
2. Abandon: a launch queued at an open that the training stream T reaches only after
   ~8 s of GPU work; close() must give up at its 5 s deadline, warn, and return. Then T
   finishes (the abandoned launch runs or exits) and a fresh allocation and sync must work.

Outcomes of part 2:
- close about 5 s, a warning, T done later, "context ok: True": G7 is harmless on this
  driver (the destroy neither blocks nor breaks the context).
- close about 8 s and T already done when it returned: the destroy waited for the queued
  work (G7: close hangs for as long as the GPU needs to reach the open).
- close not returned within 30 s: the destroy (or something else) hangs.
- an error or "context ok: False" after T finishes: the teardown under the queued kernel
  broke the process's CUDA context.
"""

from __future__ import annotations

import time
import warnings

from _probe import bounded, cycles_per_ms, hard_exit, note, result

NAME = "probe_abandon_green"


def main() -> None:
    import torch

    import freeride as fr

    torch.ones(1, device="cuda").cpu()
    cyc = cycles_per_ms(torch)
    # Streams first: creating one may wait for the device.
    T = torch.cuda.Stream()
    B = torch.cuda.Stream()

    # 1. The normal path: close beside unrelated GPU work.
    h = fr.Harvester("cuda:0")
    mech = h.reserve_mechanism
    note(NAME, f"reserve {mech} (fallback: {h.reserve_fallback}), {cyc / 1e6:.2f} GHz")
    if h.reserve_fallback is not None:
        result(NAME, f"no green context ({h.reserve_fallback}): G7 is not exercised here")
    t = h.submit(fr.tasks.Spin(10**9, 10_000))
    time.sleep(0.2)
    with torch.cuda.stream(B):
        torch.cuda._sleep(int(2000 * cyc))  # ~2 s, unrelated to the harvester
    time.sleep(0.05)
    closing = time.perf_counter()
    closed = bounded(h.close, 30.0, "close (normal)")
    b_done = B.query()
    result(
        NAME,
        f"normal close beside 2 s of unrelated GPU work on another stream: {closed} "
        f"(that stream already done when close returned: {b_done}); task {t.state}",
    )
    if not closed.done:
        hard_exit(1)
    waited = bounded(B.synchronize, 10.0, "B.synchronize")
    note(
        NAME,
        f"the unrelated stream finished {time.perf_counter() - closing:.2f} s after close began",
    )
    if not waited.done:
        hard_exit(1)

    # 2. Abandon: a launch at an open the GPU reaches only after ~8 s.
    h = fr.Harvester("cuda:0")
    t = h.submit(fr.tasks.Spin(10**9, 10_000))
    time.sleep(0.2)
    h.gate.close(stream="host")
    time.sleep(0.05)
    before = h.launch_counts()
    with torch.cuda.stream(T):
        torch.cuda._sleep(int(8000 * cyc))  # ~8 s
        h.gate.open(stream=T)  # a launch at this open, queued in the green stream
        h.gate.close(stream=T)
    carried = h.launch_counts().at_opens - before.at_opens
    queued_at = time.perf_counter()
    caught: list = []

    def close() -> None:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            h.close()
        caught.extend(w)

    closed = bounded(close, 30.0, "close (abandon)")
    t_done = T.query()
    result(
        NAME,
        f"{mech}: close with a launch queued at an open ~8 s ahead ({carried} launch at it): "
        f"{closed} (deadline 5 s); T already done when it returned: {t_done}; task {t.state}; "
        f"warnings {len(caught)}" + (f" ({str(caught[0].message)[:160]})" if caught else ""),
    )
    if not closed.done:
        hard_exit(2)
    synced = bounded(T.synchronize, 20.0, "T.synchronize")
    note(NAME, f"T finished {time.perf_counter() - queued_at:.2f} s after the open was queued")
    if not synced.done:
        result(NAME, f"T.synchronize() {synced}: the stalled stream never finished")
        hard_exit(3)

    def check() -> bool:
        x = torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()
        return float(x.sum()) == float(1 << 20)

    ok = bounded(check, 20.0, "check")
    result(
        NAME,
        f"after T finished: context ok: {ok.value if ok.done and ok.error is None else False} "
        f"({ok}); T.synchronize {synced}",
    )
    if not ok.done:
        hard_exit(4)


if __name__ == "__main__":
    main()
