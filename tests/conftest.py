import os

# Before anything imports freeride: _C creates its test hooks (_C._testing) only where this
# is "1" at import, and the child processes tests spawn inherit it.
os.environ.setdefault("FREERIDE_TEST_HOOKS", "1")

import json
import time

import pytest

import freeride as fr

_INFO = fr.backend_info()
HAS_GPU = bool(_INFO["cuda"])
NO_GPU_REASON = f"no usable CUDA GPU here ({_INFO.get('reason') or 'none found'})"


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason=NO_GPU_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Every protocol test runs on the host backend; with -m gpu on a GPU machine, also on cuda.
BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=BACKENDS)
def harvester(request):
    kwargs = {"workers": 4} if request.param == "cpu" else {}
    with fr.Harvester(request.param, **kwargs) as h:
        yield h


@pytest.fixture
def host():
    with fr.Harvester("cpu", workers=4) as h:
        yield h


@pytest.fixture
def ex(request):
    """An executor on the test queue backend (_C._testing.queue_executor), closed after the
    test; made with the test module's QUEUE_SETTINGS where it has them (phases_ahead=True,
    say), the defaults otherwise."""
    from freeride import _C

    executor = _C._testing.queue_executor(**getattr(request.module, "QUEUE_SETTINGS", {}))
    yield executor
    executor.close(0.5)


def queue_status(ex, task_id):
    """(state, items done, phase) of a task of an executor."""
    state, items, _total, phase = ex.status(task_id)[:4]
    return state, items, phase


def queue_progress(ex, task_id):
    """(state, items done) of a task of an executor."""
    return tuple(ex.status(task_id)[:2])


def wait_until(predicate, timeout=10.0, interval=0.002):
    """Polls predicate until true; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not reached within {timeout} s")


def runner_launches(ex, index):
    """On the test queue backend (_C._testing.queue_executor): the index-th runner's
    launches, once its first phase has begun (it takes none before: the CUDA runner
    neither)."""
    from freeride import _C

    q = _C._testing.queue_launches(ex, index)
    wait_until(lambda: q.begun)
    return q


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def os_thread_ids() -> set[str]:
    """The process's threads now, by kernel thread id: threads left by an earlier test
    may end meanwhile, so what a test leaves behind is what is here and was not before."""
    return set(os.listdir("/proc/self/task"))


def run_ranks(target, world, outdir, *args):
    """Spawns `world` processes running target(rank, *args) (freeride.cli.spawn), each of
    which writes rank<N>.json into `outdir` with "ok" (and "error" if not: see
    tests/rank_result.py); returns those results by rank, failing the test with a rank's
    error."""
    from freeride.cli.spawn import run_ranks as spawn

    spawn(target, world, *args)
    results = []
    for rank in range(world):
        with open(os.path.join(outdir, f"rank{rank}.json")) as f:
            res = json.load(f)
        assert res["ok"], res.get("error")
        results.append(res)
    return results
