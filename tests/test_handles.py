"""The one Handle protocol: TaskHandle, IterativeHandle and RemoteHandle offer the same
members, the same cancel(wait, timeout), and end in one of FINAL_STATES."""

from __future__ import annotations

import inspect
import threading
import time

import pytest

import freeride as fr
from conftest import wait_until
from freeride.handle import FINAL_STATES, Handle
from freeride.job import messages
from freeride.job.placement import TaskSpec

CLASSES = (fr.TaskHandle, fr.IterativeHandle, fr.RemoteHandle)
MEMBERS = (
    "id",
    "state",
    "items_done",
    "items_total",
    "progress",
    "done",
    "wait",
    "result",
    "cancel",
)
METHODS = ("done", "wait", "result", "cancel")


class Stepper(fr.IterativeTask):
    """Each step sleeps `step_s`; `started` is set when the first step starts."""

    def __init__(self, step_s=0.001, steps=None, fail=False):
        self.step_s = step_s
        self.total_steps = steps
        self.fail = fail
        self.steps = 0
        self.started = threading.Event()

    def step(self):
        self.started.set()
        if self.fail:
            raise RuntimeError("step failed on purpose")
        time.sleep(self.step_s)
        self.steps += 1

    def finished(self):
        return self.total_steps is not None and self.steps >= self.total_steps

    def result(self):
        return self.steps


class Owner:
    """A RemoteHandle's owner without a queue: records what it sends; `answer` plays the
    coordinator, which finalises a cancelled task with an update."""

    def __init__(self, answer=False, gone=False):
        self.sent = []
        self.answer = answer
        self.gone = gone
        self.handle = None

    def _send_coord(self, message):
        if self.gone:
            raise ConnectionError("the job queue is gone")
        self.sent.append(message)
        if self.answer and message[0] == "cancel":
            self.handle._update("cancelled", 0, 3, 10, "cancelled", None, "cancelled")


def remote(answer=False, gone=False):
    owner = Owner(answer=answer, gone=gone)
    handle = fr.RemoteHandle(owner, "0:1", TaskSpec(fr.tasks.Spin, kwargs={"items": 10}))
    owner.handle = handle
    return owner, handle


@pytest.fixture
def host():
    with fr.Harvester("cpu", workers=2) as h:
        yield h


def test_the_protocol_is_exported_and_the_final_states_are_one_constant():
    assert fr.Handle is Handle and "Handle" in fr.__all__
    assert frozenset({"done", "failed", "cancelled"}) == FINAL_STATES
    assert isinstance(FINAL_STATES, frozenset)
    assert {"queued", "running", "paused"} | FINAL_STATES == set(messages.STATES)
    assert not messages._state(["done"])  # a malformed message's state is refused, not raised
    assert not hasattr(messages, "FINAL")  # no second list to keep in step


def test_each_class_has_the_protocol_members_with_its_signatures():
    for cls in CLASSES:
        for name in MEMBERS:
            assert hasattr(cls, name), f"{cls.__name__} lacks {name}"
            assert getattr(Handle, name).__doc__, f"Handle.{name} is undocumented"
        for name in METHODS:
            got = inspect.signature(getattr(cls, name)).parameters
            want = inspect.signature(getattr(Handle, name)).parameters
            assert [(p.name, p.kind) for p in got.values()] == [
                (p.name, p.kind) for p in want.values()
            ], f"{cls.__name__}.{name}{inspect.signature(getattr(cls, name))}"
            assert all(p.default is not p.empty for p in list(got.values())[1:])


def test_one_cancel_signature_keeps_each_class_default():
    for cls in CLASSES:
        params = inspect.signature(cls.cancel).parameters
        assert list(params) == ["self", "wait", "timeout"]
        assert params["wait"].default is True
    # A wait on the job queue is bounded by default (it may be gone); local waits are not.
    assert inspect.signature(fr.RemoteHandle.cancel).parameters["timeout"].default == 30.0
    assert inspect.signature(fr.TaskHandle.cancel).parameters["timeout"].default is None
    assert inspect.signature(fr.IterativeHandle.cancel).parameters["timeout"].default is None


def test_a_class_missing_a_member_is_not_a_handle():
    class Full:
        id = 1
        state = "done"
        items_done = items_total = 1
        progress = 1.0

        def done(self):
            return True

        def wait(self, timeout=None):
            return True

        def result(self, timeout=None):
            return None

        def cancel(self, wait=True, timeout=None):
            return False

    class NoCancel(Full):
        cancel = None

    class NoItemsTotal:
        id = 1
        state = "done"
        items_done = 1
        progress = 1.0
        done = Full.done
        wait = Full.wait
        result = Full.result
        cancel = Full.cancel

    assert isinstance(Full(), Handle)
    assert not isinstance(NoCancel(), Handle)
    assert not isinstance(NoItemsTotal(), Handle)
    assert not isinstance(object(), Handle)


def test_task_handle_is_a_handle_and_cancel_takes_the_common_arguments(host):
    running = host.submit(fr.tasks.Spin(items=10**9, ns_per_item=20_000))
    assert isinstance(running, Handle)
    wait_until(lambda: running.items_done > 0)
    with pytest.raises(ValueError, match="timeout"):
        running.cancel(timeout=-1)
    assert not running.done()  # a bad timeout cancels nothing
    assert running.cancel(wait=True, timeout=10) is True
    assert running.state == "cancelled" and running.state in FINAL_STATES and running.done()
    assert running.cancel(wait=False) is False  # already final
    assert running.cancel(wait=True, timeout=0) is False
    queued_behind = host.submit(fr.tasks.Spin(items=10**9, ns_per_item=20_000))
    assert queued_behind.cancel(wait=False, timeout=5) is True
    assert queued_behind.wait(10) and queued_behind.state == "cancelled"
    finished = host.submit(fr.tasks.Spin(items=20, ns_per_item=1000))
    assert finished.wait(10)
    assert finished.state == "done" and finished.state in FINAL_STATES
    assert finished.cancel() is False and finished.state == "done"


def test_iterative_handle_is_a_handle_and_cancel_takes_the_common_arguments(host):
    task = Stepper(step_s=0.3)
    running = host.submit(task)
    assert isinstance(running, fr.IterativeHandle) and isinstance(running, Handle)
    assert task.started.wait(10)
    with pytest.raises(ValueError, match="timeout"):
        running.cancel(timeout=-1)
    assert not running.done()
    # A step of 0.3 s is running: it finishes before the task is final.
    assert running.cancel(wait=True, timeout=0.01) is False
    assert running.wait(10)
    assert running.state == "cancelled" and running.state in FINAL_STATES and running.done()
    assert running.cancel(wait=True, timeout=1) is False  # already final
    other = host.submit(Stepper())
    assert other.cancel(wait=True, timeout=10) is True
    assert other.state in FINAL_STATES
    finished = host.submit(Stepper(steps=3))
    assert finished.wait(10) and finished.state == "done" and finished.state in FINAL_STATES
    assert finished.cancel(wait=False) is False
    failed = host.submit(Stepper(fail=True))
    assert failed.wait(10) and failed.state == "failed" and failed.state in FINAL_STATES


def test_remote_handle_is_a_handle_and_cancel_takes_the_common_arguments():
    owner, handle = remote()
    assert isinstance(handle, Handle)
    assert handle.state == "queued" and not handle.done()
    # No answer from the queue: not final within the timeout.
    assert handle.cancel(wait=True, timeout=0.01) is False
    assert handle.cancel(wait=False) is False
    assert owner.sent == [("cancel", "0:1")] * 2
    handle._update("cancelled", 0, 3, 10, "cancelled", None, "cancelled")
    assert handle.state in FINAL_STATES and handle.done()
    assert handle.cancel(wait=True, timeout=1) is True  # final: True, and nothing sent
    assert len(owner.sent) == 2
    owner, answered = remote(answer=True)
    assert answered.cancel(timeout=5) is True
    assert answered.state == "cancelled" and answered.items_done == 3
    with pytest.raises(fr.TaskCancelledError):
        answered.result(0)
    _, orphan = remote(gone=True)
    assert orphan.cancel(wait=True, timeout=None) is True
    assert orphan.state == "cancelled" and orphan.state in FINAL_STATES
    _, finished = remote()
    finished._update("done", 0, 10, 10, None, 42)
    assert finished.state in FINAL_STATES and finished.result(0) == 42
    assert finished.cancel() is True and finished.state == "done"


@pytest.mark.parametrize("state", ["queued", "running", "paused", *sorted(FINAL_STATES)])
def test_done_is_membership_in_the_final_states(state):
    _, handle = remote()
    handle._update(state, 0, 0, None, None, None)
    assert handle.done() == (state in FINAL_STATES)
    assert handle.wait(0) == (state in FINAL_STATES)
