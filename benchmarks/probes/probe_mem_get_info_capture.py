"""Does torch.cuda.mem_get_info (cudaMemGetInfo), called from another thread while a torch
CUDA graph capture is in progress in the default global capture mode, invalidate that
capture? (review 2026-11-26, G15(c))

    python3 probe_mem_get_info_capture.py [CAPTURES]

freeride's recorder calls torch.cuda.mem_get_info on the training thread once per recorded
iteration (recorder.py, _free_memory). In global capture mode CUDA invalidates a capture
when any thread makes a call that is "potentially unsafe" during one (event queries,
synchronisations, ...): if cudaMemGetInfo is one, a rank whose other thread captures a
graph (or a capture on another device's training thread of the same process) would lose
it. Nothing freeride is involved here: plain torch.

Three runs of CAPTURES (20) captures on one thread, each held open ~50 ms with host
sleeps so that the other thread's calls land inside it, then replayed and compared:
1. baseline, no other thread: every capture must succeed (else the rest means nothing);
2. another thread calling torch.cuda.mem_get_info() in a loop (20 us apart): THE
   QUESTION;
3. control: another thread calling event.query() in a loop, which the H200 showed
   invalidates captures: the detector must see failures here, else a "no" in run 2
   proves nothing.

ANSWER line: "yes" (run 2 had failed captures or the calling thread got capture errors),
"no" (none, with the control failing as it should), or "undetermined" (the baseline
failed or the control did not).
"""

from __future__ import annotations

import sys
import threading
import time

from _probe import answer, bounded, hard_exit, result

NAME = "probe_mem_get_info_capture"
HOLD_S = 0.05
OPS = 50


def main() -> None:
    captures = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    import torch

    x = torch.randn(1 << 16, device="cuda")
    event = torch.cuda.Event()
    event.record()
    torch.cuda.mem_get_info()
    torch.cuda.synchronize()
    capturing = threading.Event()

    def work(k: float):
        y = x
        for _ in range(OPS):
            y = y * 0.5 + k
        return y

    def run(label: str, call) -> dict:
        stop = threading.Event()
        stats = {"calls": 0, "inside": 0, "errors": 0, "first_error": ""}

        def loop() -> None:
            while not stop.is_set():
                inside = capturing.is_set()
                try:
                    call()
                except Exception as exc:  # noqa: BLE001 - counted
                    stats["errors"] += 1
                    stats["first_error"] = stats["first_error"] or str(exc).splitlines()[0]
                    time.sleep(0.001)
                stats["calls"] += 1
                stats["inside"] += inside
                time.sleep(20e-6)  # lets the capturing thread have the GIL

        thread = threading.Thread(target=loop, daemon=True) if call else None
        if thread:
            thread.start()
        failed, matched, first_failure = 0, 0, ""
        stream = torch.cuda.current_stream()
        try:
            for i in range(captures):
                k = float(i + 1)
                expected = work(k)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                capturing.set()
                try:
                    with torch.cuda.graph(g):  # capture_error_mode="global", the default
                        out = work(k)
                        time.sleep(HOLD_S)
                except Exception as exc:  # noqa: BLE001 - cudaErrorStreamCaptureInvalidated
                    failed += 1
                    first_failure = first_failure or str(exc).splitlines()[0]
                    torch.cuda.set_stream(stream)  # a failed capture_end leaves its stream
                    torch.cuda.synchronize()
                    continue
                finally:
                    capturing.clear()
                g.replay()
                torch.cuda.synchronize()
                matched += bool(torch.equal(out, expected))
        finally:
            stop.set()
            if thread:
                thread.join(10)
        summary = {"failed": failed, "matched": matched, "first_failure": first_failure} | stats
        result(
            NAME,
            f"{label}: {failed}/{captures} captures failed, {matched} replays matched; other "
            f"thread: {stats['calls']} calls ({stats['inside']} during captures), "
            f"{stats['errors']} errors"
            + (f" (first: {stats['first_error'][:120]})" if stats["errors"] else "")
            + (f"; first capture failure: {first_failure[:120]}" if failed else ""),
        )
        return summary

    def bounded_run(label: str, call) -> dict:
        r = bounded(lambda: run(label, call), 60.0, label)
        if not r.done:
            result(NAME, f"{label}: {r}")
            hard_exit(1)
        if r.error is not None:
            result(NAME, f"{label}: {r}")
            hard_exit(1)
        return r.value

    base = bounded_run("baseline, no other thread", None)
    mem = bounded_run("torch.cuda.mem_get_info() from another thread", torch.cuda.mem_get_info)
    ctl = bounded_run("control, event.query() from another thread", event.query)
    broke = mem["failed"] > 0 or mem["errors"] > 0
    valid = base["failed"] == 0 and (ctl["failed"] > 0 or ctl["errors"] > 0) and mem["inside"] > 0
    if broke:
        verdict = "yes"
    elif valid:
        verdict = "no"
    else:
        verdict = "undetermined"
    answer(
        NAME,
        f"{verdict}: mem_get_info from another thread during a global-mode capture "
        f"{'invalidated it' if broke else 'left it valid'} ({mem['failed']} of {captures} "
        f"failed, {mem['inside']} calls inside captures); baseline failures "
        f"{base['failed']}, control failures {ctl['failed']} (errors {ctl['errors']})",
    )


if __name__ == "__main__":
    main()
