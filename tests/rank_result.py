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
