"""Process-wide registry of open freeride objects, and what SIGTERM does while any is open.

An object that owns threads (a Harvester, a JobQueue) registers itself when it opens,
with a fast local close (``register(obj, fn)``: no collective, no waiting for other
processes), and unregisters when it closes. The registry holds both weakly: an object
dropped without close() leaves it by itself.

SIGTERM: Python's default action kills the process with no cleanup. While an object is
registered, and provided SIGTERM had its default action (a handler of the user's is never
replaced, nor one installed later touched), a handler installed on the main thread closes
every registered object, newest first, within SIGTERM_BUDGET_S in all (side tasks stop at
an item boundary: an item in flight finishes, no new one starts), puts the default action
back and raises SIGTERM again, so the process still ends killed by SIGTERM (status -15 to
its parent, 143 in a shell). The handler goes once the last object unregisters (on the
main thread; elsewhere the default action is put back below Python).

Python runs signal handlers on the main thread between bytecodes: a main thread blocked in
native code (a collective whose peer is gone) would run the handler only when that
returns, and SIGTERM would seem ignored. A watchdog in the extension (csrc/sigterm_guard)
covers that: if the handler has not started SIGTERM_GRACE_S after the signal, SIGTERM's
default action ends the process then, without the cleanup.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ._C import _sigterm_guard_arm, _sigterm_guard_disarm, _sigterm_guard_stand_down

# The closes the SIGTERM handler waits for, in all; past it the process ends anyway.
SIGTERM_BUDGET_S = 0.4
# How long after a SIGTERM the handler may take to start before the watchdog ends the
# process without it (the main thread is stuck in native code).
SIGTERM_GRACE_S = 0.5

_lock = threading.Lock()  # _entries and _installed; never held while calling out
_handler_lock = threading.Lock()  # installing and removing the handler
# id(obj) -> (weak reference to obj, callable returning its close function or None)
_entries: dict[int, tuple[weakref.ref, Callable[[], Callable[[], None] | None]]] = {}
_installed = False  # our SIGTERM handler (and the watchdog) is in place
# Called by the SIGTERM handler once everything is closed, just before SIGTERM is raised
# again (for tests: the process leaves no other trace).
_after_sigterm: list[Callable[[], None]] = []


def register(obj: Any, fn: Callable[[], None]) -> None:
    """`fn()` closes `obj` quickly and locally; close_all() and SIGTERM call it. Neither is
    kept alive by the registry (a bound method of `obj` is held weakly; any other `fn`
    must not refer to `obj`)."""
    ref = weakref.ref(obj, _dropped)
    if inspect.ismethod(fn) and fn.__self__ is obj:
        # The plain function and a weak reference to `obj`, bound at call time (not a
        # WeakMethod, whose own callback fails noisily when it dies at interpreter exit).
        func = fn.__func__

        def call() -> Callable[[], None] | None:
            target = ref()
            return None if target is None else functools.partial(func, target)

    else:

        def call(fn: Callable[[], None] = fn) -> Callable[[], None]:
            return fn

    with _lock:
        _purge_locked()
        _entries[id(obj)] = (ref, call)
    _install()


def unregister(obj: Any) -> None:
    """`obj` is closed (or closing): SIGTERM no longer needs to close it."""
    with _lock:
        entry = _entries.get(id(obj))
        if entry is not None and entry[0]() is obj:
            del _entries[id(obj)]
        _purge_locked()
    _uninstall_if_idle()


def registered() -> list[Any]:
    """The objects registered now, oldest first."""
    with _lock:
        objs = [ref() for ref, _ in _entries.values()]
    return [obj for obj in objs if obj is not None]


def close_all(timeout: float | None = None) -> bool:
    """Closes every registered object, newest first, with its registered function (an
    error is skipped: closing the rest matters more). With `timeout`, the closes run on
    a thread ("freeride-shutdown") this call waits for at most `timeout` seconds; False
    if they did not all return in time."""
    if timeout is None:
        _close_entries()
        done = True
    else:
        done = _close_bounded(timeout)
    _uninstall_if_idle()
    return done


def _close_bounded(timeout: float) -> bool:
    closer = threading.Thread(target=_close_entries, name="freeride-shutdown", daemon=True)
    closer.start()
    closer.join(timeout)
    return not closer.is_alive()


def _close_entries() -> None:
    with _lock:
        entries = list(_entries.values())
        _entries.clear()
    for ref, call in reversed(entries):
        fn = call()
        if fn is None or ref() is None:
            continue
        try:
            fn()
        except Exception:  # noqa: BLE001, S110 - closing the rest matters more
            pass


def _purge_locked() -> None:
    for key in [key for key, (ref, _) in _entries.items() if ref() is None]:
        del _entries[key]


def _dropped(_ref: weakref.ref) -> None:
    """An object went away without unregister() (a weakref callback: it may run inside
    any allocation, so nothing here waits for a lock)."""
    if not _lock.acquire(blocking=False):
        return
    try:
        _purge_locked()
    finally:
        _lock.release()
    _uninstall_if_idle(blocking=False)


def _is_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _install() -> None:
    """Our SIGTERM handler and its watchdog, where SIGTERM has its default action."""
    global _installed
    if not _is_main_thread():
        return  # signal.signal() works only there; a later register() on it installs
    with _handler_lock:
        with _lock:
            if _installed or not _entries:
                return
        current = signal.getsignal(signal.SIGTERM)
        # Ours: left by a close on another thread, which could only put the default
        # action back below Python (see _uninstall_if_idle).
        if current is not _on_sigterm and current != signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_guard_arm(SIGTERM_GRACE_S)
        with _lock:
            _installed = True


def _uninstall_if_idle(blocking: bool = True) -> None:
    """Once nothing is registered: SIGTERM's default action again, watchdog joined."""
    global _installed
    if not _handler_lock.acquire(blocking=blocking):
        return
    try:
        with _lock:
            if any(ref() is not None for ref, _ in _entries.values()):
                return
            was_installed, _installed = _installed, False
        main = _is_main_thread()
        if was_installed:
            _sigterm_guard_disarm(not main)
        # On the main thread also a handler left by a close elsewhere, which could only
        # put the default action back below Python.
        if main and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    finally:
        _handler_lock.release()


def _on_sigterm(signum: int, _frame: Any) -> None:
    """Closes what is open (bounded), then dies by SIGTERM as the default action would.
    Takes no lock on this thread: the signal may have interrupted it holding one."""
    _sigterm_guard_stand_down()
    _close_bounded(SIGTERM_BUDGET_S)
    _sigterm_guard_disarm(False)
    signal.signal(signum, signal.SIG_DFL)
    for hook in _after_sigterm:
        try:
            hook()
        except Exception:  # noqa: BLE001, S110 - the process ends regardless
            pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    time.sleep(1.0)  # not reached: the default action ends the process
    os._exit(128 + signum)


def _after_fork_in_child() -> None:
    """A forked child has none of the registered objects' threads (and no watchdog: the
    extension let go of it): it must not try to close them, and SIGTERM acts as usual."""
    global _installed, _lock, _handler_lock
    _lock = threading.Lock()
    _handler_lock = threading.Lock()
    _entries.clear()
    if _installed and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _installed = False


os.register_at_fork(after_in_child=_after_fork_in_child)
