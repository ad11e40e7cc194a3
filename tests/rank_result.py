"""How a test's rank process reports to the parent test: one JSON file per rank."""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable


def write_result(outdir: str, rank: int, result: dict) -> None:
    """Writes `result` as the rank's rank<N>.json in `outdir` (conftest.run_ranks reads it)."""
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def run_and_report(rank: int, outdir: str, body: Callable[[dict], None]) -> None:
    """Runs body(result) and writes rank<N>.json with "ok" (and "error", the traceback, if
    it raised); destroys the rank's process group, if any, either way."""
    import torch.distributed as dist

    result: dict = {"rank": rank, "ok": False}
    try:
        body(result)
        result["ok"] = True
    except Exception:  # noqa: BLE001 - reported to the parent test through the JSON
        result["error"] = traceback.format_exc()
    finally:
        write_result(outdir, rank, result)
        if dist.is_initialized():
            dist.destroy_process_group()


def report_and_exit(rank: int, outdir: str, result: dict, body: Callable[[dict], None]) -> None:
    """Runs body(result), adds the freeride threads still alive ("threads_after") and "ok"
    (or "error", the traceback), writes rank<N>.json and ends the process at once: a rank
    of a job that lost a rank (or whose peer never closes) must not wait in a collective
    teardown."""
    import threading

    try:
        body(result)
        result["threads_after"] = sorted(
            t.name for t in threading.enumerate() if t.name.startswith("freeride")
        )
        result["ok"] = True
    except Exception:  # noqa: BLE001 - reported to the parent test through the JSON
        result["ok"] = False
        result["error"] = traceback.format_exc()
    finally:
        write_result(outdir, rank, result)
        os._exit(0)
