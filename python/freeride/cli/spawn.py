"""Rank processes on this machine, without torchrun: the one way the demo, the benchmarks
that train (bench ranks, bench soak) and the tests' multi-process jobs start their ranks
and bring them into one torch.distributed group. With `sessions`, each rank runs in its
own session, as torchrun starts its workers: where the kernel groups scheduling by
session (autogroup), that decides which threads compete for the cores as equals.

The parent calls run_ranks(target, world, ...); each rank, in target, calls
join_group(rank, world, folder) with the folder the parent gave every rank: they meet
through a file store in it (no port to pick, nothing left listening).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# The file store's name in the ranks' shared folder.
STORE = "store"


def join_group(rank: int, world: int, folder: str, backend: str = "gloo", **options: Any) -> None:
    """Makes this process rank `rank` of `world` in torch.distributed's default group,
    meeting the others through the file store `folder`/store (`folder`: the same for every
    rank of the run, and for no other run). `options` go to init_process_group (timeout)."""
    import torch.distributed as dist

    dist.init_process_group(
        backend,
        init_method=f"file://{os.path.join(folder, STORE)}",
        rank=rank,
        world_size=world,
        **options,
    )


def _in_own_session(rank: int, target: Callable[..., None], *args: Any) -> None:
    # torchrun's workers are started with start_new_session=True; a spawned rank is no
    # process group's leader, so setsid() cannot fail here.
    os.setsid()
    target(rank, *args)


def _exit_after(rank: int, target: Callable[..., None], *args: Any) -> None:
    """Runs target(rank, *args); once it returns, ends the process as a normal exit would
    (threading's shutdown: its exit callbacks, such as concurrent.futures' that stop idle
    pool workers, and the join of the other non-daemon threads; then the atexit handlers
    and a flush of the output) but without tearing the interpreter down. A gloo process
    group's worker thread can still be letting go of a finished collective's tensors when
    the rank returns: where that drops a tensor's last Python reference it takes the GIL,
    and during the interpreter's teardown taking the GIL ends the thread (pthread_exit),
    whose unwinding through torch's noexcept frames aborts the process ("terminate called
    without an active exception": 4 of about 90 runs of the DeepSpeed test on two cores).
    An exception from target propagates as before (torch's spawn reports it); SystemExit
    too, and so takes the teardown."""
    target(rank, *args)
    # CPython's own first step of an exit (Py_FinalizeEx calls it): private, but
    # long-standing. It must run on the main thread, as a spawned rank's target does.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing left to write
            pass
    os._exit(0)


def run_ranks(
    target: Callable[..., None],
    world: int,
    *args: Any,
    timeout: float | None = None,
    sessions: bool = False,
) -> None:
    """Runs target(rank, *args) in `world` new processes, rank 0 to world-1, and returns
    once all of them have ended. They are spawned (each imports its modules afresh, as CUDA
    needs), so `target` must be a module-level function and `args` picklable; their output
    goes where this process's does.

    As torch.multiprocessing.spawn, which this is with a timeout: the first rank to raise or
    exit non-zero ends the others, and its error is raised here (ProcessRaisedException with
    the rank's traceback, or ProcessExitedException with its exit code or signal). With
    `timeout` (seconds), the ranks still running then are killed (SIGKILL) and TimeoutError
    names them; None waits for good. `sessions`: each rank calls setsid() before target,
    as torchrun's workers run (each its own session, and so its own scheduling group
    where autogroup is on); False: they stay in this process's session. A rank whose
    target returns exits 0 without the interpreter's teardown, after its atexit handlers
    (_exit_after says why)."""
    import torch.multiprocessing as mp

    if sessions:
        target, args = _in_own_session, (target, *args)
    target, args = _exit_after, (target, *args)
    context = mp.start_processes(target, args=args, nprocs=world, join=False, start_method="spawn")
    deadline = None if timeout is None else time.monotonic() + timeout
    while not context.join(None if deadline is None else max(0.0, deadline - time.monotonic())):
        left = [rank for rank, p in enumerate(context.processes) if p.is_alive()]
        if deadline is not None and time.monotonic() >= deadline and left:
            for p in context.processes:
                if p.is_alive():
                    p.kill()
                p.join()
            raise TimeoutError(f"rank(s) {left} still running after {timeout:g} s: killed")
