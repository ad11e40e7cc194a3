"""Attaching a harvester to torch.distributed.pipelining schedules.

Every schedule, whatever its kind, runs its compute through the stage methods
forward_one_chunk, backward_one_chunk and (torch >= 2.5) backward_weight_one_chunk, and
the last stage's loss through the schedule's _maybe_compute_loss. Wrapping those per
instance closes the gate around exactly the compute actions, with no per-schedule tables.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from .record.recorder import Recorder

# (method, label) of the compute a stage does; absent methods (older torch) are skipped.
_STAGE_METHODS = (
    ("forward_one_chunk", "F"),
    ("backward_one_chunk", "B"),
    ("backward_weight_one_chunk", "W"),
)
_MIN_TORCH = (2, 4)


def _torch_version() -> tuple[int, int]:
    import torch

    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def schedule_stages(schedule: Any) -> list[Any]:
    """The pipeline stages a torch.distributed.pipelining schedule runs on this rank."""
    try:
        from torch.distributed.pipelining import schedules
    except ImportError as exc:  # pragma: no cover - torch without distributed
        raise TypeError("attach() needs torch.distributed.pipelining (torch >= 2.4)") from exc
    base = getattr(schedules, "_PipelineSchedule", None)
    if base is None or not isinstance(schedule, base):
        raise TypeError(
            "schedule must be a torch.distributed.pipelining schedule (ScheduleGPipe, "
            f"Schedule1F1B, ScheduleInterleaved1F1B, ...); got {type(schedule).__name__}. "
            "For other training loops use h.compute() and h.iteration()."
        )
    if _torch_version() < _MIN_TORCH:
        raise RuntimeError(f"attach() supports torch >= 2.4, found {_torch_version()}")
    # Multi-stage schedules keep a list, single-stage ones one stage (stable since 2.4).
    if hasattr(schedule, "_stages"):
        return list(schedule._stages)
    if hasattr(schedule, "_stage"):
        return [schedule._stage]
    raise TypeError(f"{type(schedule).__name__} has no stages this version of freeride knows")


def _on_device(stage: Any, kind: str, device: int) -> bool:
    import torch

    dev = torch.device(getattr(stage, "device", "cpu"))
    if kind == "host":
        return dev.type == "cpu"
    return dev.type == "cuda" and (dev.index or 0) == device


def _label(kind: str, stage: Any, args: tuple, kwargs: dict) -> str:
    chunk = args[0] if args else kwargs.get("fwd_chunk_id", kwargs.get("bwd_chunk_id", "?"))
    if kind == "B" and kwargs.get("full_backward", True) is False:
        kind = "I"  # backward-input only: the weight gradient comes later as "W"
    return f"{kind} s{getattr(stage, 'stage_index', '?')} mb{chunk}"


class _Patch:
    """One attribute replaced on one object, and how to put it back exactly."""

    def __init__(self, obj: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        self.obj = obj
        self.name = name
        self.had_own = name in vars(obj)
        self.own = vars(obj).get(name)
        original = getattr(obj, name)
        setattr(obj, name, make(original))

    def undo(self) -> None:
        if self.had_own:
            setattr(self.obj, self.name, self.own)
        else:
            delattr(self.obj, self.name)


def _compute_wrapper(
    recorder: Recorder,
    label: Callable[[tuple, dict], str],
    computes: Callable[[tuple, dict], bool] | None = None,
):
    """Wraps a method in a compute action; with `computes`, only the calls for which it
    says the method does compute (others run as they are, gate untouched)."""

    def make(original: Callable) -> Callable:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # One span of the hooks' timer from here to the closed gate (the test and the
            # label are the hook's work too), not one per step: each reading costs the
            # training thread a call.
            t0 = time.perf_counter_ns()
            if computes is not None and not computes(args, kwargs):
                recorder.add_hook_ns(time.perf_counter_ns() - t0)
                return original(*args, **kwargs)
            with recorder.compute(label(args, kwargs), since_ns=t0):
                return original(*args, **kwargs)

        return wrapper

    return make


def _step_wrapper(recorder: Recorder):
    def make(original: Callable) -> Callable:
        @functools.wraps(original)
        def step(*args: Any, **kwargs: Any) -> Any:
            with recorder.iteration():
                return original(*args, **kwargs)

        return step

    return make


class Attachment:
    """The hooks freeride placed on one schedule (and optimizers)."""

    def __init__(self, recorder: Recorder, schedule: Any, kind: str, device: int) -> None:
        stages = schedule_stages(schedule)
        for stage in stages:
            if not _on_device(stage, kind, device):
                where = "cpu" if kind == "host" else f"cuda:{device}"
                raise ValueError(
                    f"stage {getattr(stage, 'stage_index', '?')} is on "
                    f"{getattr(stage, 'device', '?')} but the harvester is on {where}"
                )
        self.schedule = schedule
        self.patches: list[_Patch] = []
        try:
            for stage in stages:
                for method, kind_label in _STAGE_METHODS:
                    if hasattr(stage, method):
                        self.patches.append(
                            _Patch(
                                stage,
                                method,
                                _compute_wrapper(
                                    recorder, functools.partial(_label, kind_label, stage)
                                ),
                            )
                        )
            if hasattr(schedule, "_maybe_compute_loss"):
                self.patches.append(
                    _Patch(
                        schedule,
                        "_maybe_compute_loss",
                        _compute_wrapper(
                            recorder, _loss_label, functools.partial(_computes_loss, schedule)
                        ),
                    )
                )
            self.patches.append(_Patch(schedule, "step", _step_wrapper(recorder)))
        except BaseException:
            self.detach()
            raise

    def add_optimizer(self, recorder: Recorder, optimizer: Any) -> None:
        if not callable(getattr(optimizer, "step", None)):
            raise TypeError(f"optimizer must have a step() method, got {type(optimizer).__name__}")
        self.patches.append(
            _Patch(optimizer, "step", _compute_wrapper(recorder, lambda a, k: "optimizer"))
        )

    def detach(self) -> None:
        while self.patches:
            self.patches.pop().undo()


def _computes_loss(schedule: Any, args: tuple, kwargs: dict) -> bool:
    """Whether this _maybe_compute_loss call computes a loss: torch calls it for every
    stage after every forward, but only the last stage of a schedule with a loss_fn
    computes one (the others would record an empty compute action per microbatch)."""
    stage = args[0] if args else kwargs.get("stage")
    return bool(getattr(stage, "is_last", True)) and getattr(schedule, "_loss_fn", True) is not None


def _loss_label(args: tuple, kwargs: dict) -> str:
    stage = args[0] if args else kwargs.get("stage")
    mb = args[3] if len(args) > 3 else kwargs.get("mb_index", "?")
    return f"loss s{getattr(stage, 'stage_index', '?')} mb{mb}"
