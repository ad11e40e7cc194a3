"""What the engine integrations share: an attachment of wrapped attributes that holds the
harvester weakly, and compute / iteration wrappers around the harvester's own hooks."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..attach import _Patch
from ..errors import FreerideError, HarvesterClosedError
from ..harvester import Harvester


class IntegrationError(FreerideError, RuntimeError):
    """An engine (or a setting of it) that an integration cannot hook completely: refused
    rather than letting compute run with the gate open."""


def check_harvester(h: Any) -> None:
    """Refuses what is not an open fr.Harvester, naming the argument (an integration's
    first parameter)."""
    if not isinstance(h, Harvester):
        raise TypeError(f"h must be an fr.Harvester, got {type(h).__name__}")
    if h.closed:
        raise HarvesterClosedError("the harvester is closed")


class Attachment:
    """The hooks one integration placed for one harvester. ``detach()`` removes them all,
    leaving every object exactly as it was (idempotent). The hooks hold the harvester
    weakly: once it is closed or gone they pass every call straight through and remove
    themselves at their next call."""

    def __init__(self, harvester: Any, engine: str, on_detach: Callable[[], None]) -> None:
        if harvester.closed:
            raise HarvesterClosedError("the harvester is closed")
        self.engine = engine
        self._ref = weakref.ref(harvester)
        self._patches: list[_Patch] = []
        self._on_detach = on_detach
        self._lock = threading.Lock()
        self._depth = 0  # iterations of this attachment in progress (training thread)

    @property
    def harvester(self) -> Any:
        """The harvester, or None once it was garbage-collected."""
        return self._ref()

    @property
    def attached(self) -> bool:
        return bool(self._patches)

    @property
    def in_iteration(self) -> bool:
        return self._depth > 0

    def _live(self) -> Any:
        """The harvester if it still takes hooks; otherwise detaches and returns None."""
        h = self._ref()
        if h is None or h.closed:
            self.detach()
            return None
        return h

    def patch(self, obj: Any, name: str, make: Callable[[Callable], Any]) -> None:
        self._patches.append(_Patch(obj, name, make))

    def compute(self, label: Callable[[tuple, dict], str], check: Callable | None = None):
        """A wrapper factory: the wrapped callable runs inside ``h.compute(label=...)``;
        `check(args, kwargs)` runs first (and may raise) while the harvester is live."""

        def make(original: Callable) -> Callable:
            @functools.wraps(original)
            def compute(*args: Any, **kwargs: Any) -> Any:
                h = self._live()
                if h is None:
                    return original(*args, **kwargs)
                if check is not None:
                    check(args, kwargs)
                with h.compute(label=label(args, kwargs)):
                    return original(*args, **kwargs)

            return compute

        return make

    def iteration(self, before: Callable[[tuple, dict], Callable[[], None] | None] | None = None):
        """A wrapper factory: the wrapped callable is one iteration (``h.iteration()``).
        `before(args, kwargs)` runs first, may refuse by raising before anything ran, and
        may return an undo callable run after the iteration."""

        def make(original: Callable) -> Callable:
            @functools.wraps(original)
            def iteration(*args: Any, **kwargs: Any) -> Any:
                h = self._live()
                if h is None:
                    return original(*args, **kwargs)
                undo = before(args, kwargs) if before is not None else None
                try:
                    self._depth += 1
                    try:
                        with h.iteration():
                            return original(*args, **kwargs)
                    finally:
                        self._depth -= 1
                finally:
                    if undo is not None:
                        undo()

            return iteration

        return make

    def detach(self) -> None:
        """Removes every hook, restoring each attribute as it was. Idempotent."""
        with self._lock:
            patches, self._patches = self._patches, []
            on_detach, self._on_detach = self._on_detach, None
        try:
            while patches:
                patches.pop().undo()
        finally:
            if on_detach is not None:
                on_detach()

    def __enter__(self) -> Attachment:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def __repr__(self) -> str:
        state = "attached" if self.attached else "detached"
        return f"<freeride {self.engine} attachment, {state}, harvester={self._ref()!r}>"


def close_gate(harvester: Any) -> None:
    """Closes the gate now, as Harvester.attach() does: side work runs only inside the
    engine's iterations."""
    harvester.gate.close()


def code_names(fn: Any) -> set[str]:
    """Every global name `fn`'s code (nested functions included) looks up."""
    names: set[str] = set()
    stack = [getattr(fn, "__code__", None)]
    while stack:
        code = stack.pop()
        if code is None:
            continue
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if hasattr(c, "co_names"))
    return names
