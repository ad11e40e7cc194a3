"""Job-wide placement: what travels between ranks (TaskSpec, Load) and the policy that
chooses the rank a task runs on. Pure Python, no communication: freeride.job moves
the messages."""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._checks import check_float, parse_memory


def resolve(ref: str | Callable[..., Any]) -> Callable[..., Any]:
    """A callable from "package.module:qualified.name", or the callable itself."""
    if callable(ref):
        return ref
    if not isinstance(ref, str) or ":" not in ref:
        raise TypeError(
            f"expected a callable or a 'module:qualname' string, got {ref!r} ({type(ref).__name__})"
        )
    module_name, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{ref!r} is not callable")
    return obj


@dataclass(frozen=True)
class Load:
    """An argument computed on the rank that runs the task: ``fn(*args, **kwargs)``, with
    `fn` a "module:qualname" string (or a picklable module-level callable). Large inputs
    travel this way, by path, instead of pickled through the job queue."""

    fn: str | Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def __init__(self, fn: str | Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "fn", fn)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "kwargs", kwargs)

    def __call__(self) -> Any:
        return resolve(self.fn)(*_materialize(self.args), **_materialize(self.kwargs))


def map_nested(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """`value` with leaf(x) for every x that is not a tuple, list or dict inside it."""
    if isinstance(value, tuple):
        return tuple(map_nested(v, leaf) for v in value)
    if isinstance(value, list):
        return [map_nested(v, leaf) for v in value]
    if isinstance(value, dict):
        return {k: map_nested(v, leaf) for k, v in value.items()}
    return leaf(value)


def _materialize(value: Any) -> Any:
    return map_nested(value, lambda x: x() if isinstance(x, Load) else x)


LABEL_CHARS = 200  # the longest label a status table shows


@dataclass(frozen=True)
class TaskSpec:
    """A side task described so that any rank can build it: ``factory(*args, **kwargs)``
    must return an item task (fr.tasks.*) or an fr.IterativeTask. `factory` is a class
    or module-level function (pickled by reference) or a "module:qualname" string;
    arguments are pickled, except Load(...) placeholders, which run on the rank that
    builds the task. The module must be importable on every rank.

    Hints for the placement policy: `memory` (device memory the task will hold: bytes or
    "2GiB"; a rank whose free budget is smaller is not chosen), `iterative` (None: known
    from `factory` when it is an IterativeTask class) and `step_ms` (an iterative task's
    step time: it goes to a rank whose bubbles are at least that long).

    `result`: "return" (the submitter's ``handle.result()`` gets the task's result, with
    tensors moved to the CPU), "discard", or a path (may contain ``{id}`` and ``{rank}``)
    where the running rank saves it with torch.save; ``result()`` then returns the path.
    """

    factory: str | Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    memory: int | str | None = None
    iterative: bool | None = None
    step_ms: float | None = None
    result: str = "return"
    name: str | None = None

    def __post_init__(self) -> None:
        if not (callable(self.factory) or isinstance(self.factory, str)):
            raise TypeError(
                "factory must be a class, a module-level function or a 'module:qualname' "
                f"string, got {type(self.factory).__name__}"
            )
        if not isinstance(self.args, tuple):
            raise TypeError(f"args must be a tuple, got {type(self.args).__name__}")
        if not isinstance(self.kwargs, dict):
            raise TypeError(f"kwargs must be a dict, got {type(self.kwargs).__name__}")
        if self.memory is not None:
            parse_memory(self.memory, "memory")
        if self.step_ms is not None and check_float(self.step_ms, "step_ms") <= 0:
            raise ValueError(
                f"step_ms must be a positive number of milliseconds, got {self.step_ms!r}"
            )
        if not isinstance(self.result, str) or not self.result:
            raise TypeError("result must be 'return', 'discard' or a path")

    @property
    def memory_bytes(self) -> int:
        """The `memory` hint in bytes (0: unknown)."""
        return 0 if self.memory is None else parse_memory(self.memory, "memory")

    @property
    def is_iterative(self) -> bool:
        """Whether the task is an IterativeTask (placed by its step, not its items):
        `iterative` where given, else what the factory is."""
        if self.iterative is not None:
            return bool(self.iterative)
        from ..iterative import IterativeTask

        return isinstance(self.factory, type) and issubclass(self.factory, IterativeTask)

    @property
    def label(self) -> str:
        """What status tables call the task: `name`, else the factory's name; at most
        LABEL_CHARS (a spec's fields come from whoever submitted it: a label kept for
        thousands of tasks and sent in every table must not be as long as it likes)."""
        ref = self.name or self.factory
        text = ref if isinstance(ref, str) else getattr(ref, "__qualname__", None) or repr(ref)
        if not isinstance(text, str):
            text = type(ref).__name__
        return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"

    def build(self) -> Any:
        """The task, built here: Load placeholders run, then the factory."""
        return resolve(self.factory)(*_materialize(self.args), **_materialize(self.kwargs))

    def dumps(self) -> bytes:
        """Pickled for the trip; a clear error when something in it cannot travel."""
        try:
            return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise TypeError(
                f"task spec {self.label!r} cannot travel between ranks: {exc}. Pass classes "
                "and module-level functions (or 'module:qualname' strings), picklable "
                "arguments, and large inputs as fr.placement.Load(...) placeholders"
            ) from exc


@dataclass
class RankState:
    """What the policy knows about one rank."""

    rank: int
    alive: bool = True
    bubble_ns: int = 0  # measured bubble time per iteration (sum of its bubble slots)
    longest_bubble_ns: int = 0  # the longest bubble slot
    free_bytes: int | None = None  # free memory budget (None: no limit known)
    iterations: int = 0
    outstanding: set[str] = field(default_factory=set)  # placed, not final
    iterative: set[str] = field(default_factory=set)  # the iterative ones among them


@dataclass
class Decision:
    """One placement, for the report."""

    task: str
    label: str
    rank: int
    reason: str
    bubble_ms: dict[int, float]


class Policy:
    """Chooses a rank for a task: among live ranks with fewer than `depth` outstanding
    tasks and room for its memory hint, the one with the most measured bubble time per
    iteration left per outstanding task; an iterative task goes where the longest bubble
    fits its step (the longest bubbles when its step time is unknown), and item tasks
    avoid ranks that run an iterative task. Before any bubble is measured, the least
    loaded rank (lowest rank on ties)."""

    def __init__(self, depth: int = 2) -> None:
        self.depth = depth

    def choose(self, spec: TaskSpec, ranks: list[RankState]) -> tuple[int, str] | None:
        need = spec.memory_bytes
        candidates = [
            r
            for r in ranks
            if r.alive
            and len(r.outstanding) < self.depth
            and (r.free_bytes is None or need <= r.free_bytes)
        ]
        if not candidates:
            return None
        if spec.is_iterative:
            step_ns = int(spec.step_ms * 1e6) if spec.step_ms else 0
            fits = [r for r in candidates if r.longest_bubble_ns >= step_ns and not r.iterative]
            pool = fits or [r for r in candidates if not r.iterative] or candidates
            best = max(pool, key=lambda r: (r.longest_bubble_ns, -len(r.outstanding), -r.rank))
            return best.rank, f"longest bubble {best.longest_bubble_ns / 1e6:.2f} ms"
        if all(r.bubble_ns == 0 for r in candidates):
            best = min(candidates, key=lambda r: (len(r.outstanding), r.rank))
            return best.rank, "no bubbles measured yet: least loaded"

        def score(r: RankState) -> float:
            share = r.bubble_ns / (1 + len(r.outstanding))
            return share / 2 if r.iterative else share

        best = max(candidates, key=lambda r: (score(r), -r.rank))
        return best.rank, f"{best.bubble_ns / 1e6:.2f} ms of bubbles per iteration"
