"""Harvesting the bubbles of megatron-core's pipeline schedules.

::

    import freeride as fr
    att = fr.integrations.megatron.attach(h)   # before get_forward_backward_func()
    ...                                        # train as usual
    att.detach()

megatron-core's schedules (``forward_backward_pipelining_without_interleaving`` (1F1B),
``..._with_interleaving`` (virtual stages) and ``forward_backward_no_pipelining``) call
the module-level ``forward_step`` and ``backward_step`` of
``megatron.core.pipeline_parallel.schedules`` for every microbatch, looked up at call
time, and ``get_forward_backward_func()`` returns one of the three schedules, also looked
up at call time. attach() replaces those five module globals: each schedule call is one
iteration (``h.iteration()``), each forward_step / backward_step a compute action
(``h.compute()``), and so is ``config.finalize_model_grads_func`` (the gradient
reductions at the end of a training schedule) while a schedule runs. The optimizer step
comes after the schedule returns, when the gate is already closed.

Refused (IntegrationError) rather than missed:

* ``config.overlap_moe_expert_parallel_comm`` in a training call of the interleaved or
  non-pipelined schedule: that path (``combined_1f1b.py``) runs merged forward/backward
  steps that never call forward_step or backward_step. Raised when the schedule is
  called, before it runs anything.
* a forward_step or backward_step that runs outside a hooked schedule call, i.e. through
  a schedule function fetched from get_forward_backward_func() before attach().
* a megatron-core whose schedules module lacks these functions or no longer looks them
  up as globals (checked at attach).
"""

from __future__ import annotations

import threading
from typing import Any

from ._common import Attachment, IntegrationError, check_harvester, close_gate, code_names

# The schedule functions get_forward_backward_func() chooses from (module globals).
SCHEDULES = (
    "forward_backward_pipelining_without_interleaving",
    "forward_backward_pipelining_with_interleaving",
    "forward_backward_no_pipelining",
)
# Schedules with a combined 1F1B path (overlap_moe_expert_parallel_comm) that bypasses
# forward_step and backward_step.
_COMBINED_1F1B = (
    "forward_backward_pipelining_with_interleaving",
    "forward_backward_no_pipelining",
)

_lock = threading.Lock()
_current: Attachment | None = None


def _schedules_module() -> Any:
    try:
        from megatron.core.pipeline_parallel import schedules
    except ImportError as exc:
        raise ImportError(
            "fr.integrations.megatron needs megatron-core (pip install megatron-core)"
        ) from exc
    return schedules


def _check_module(ms: Any) -> None:
    missing = [
        n
        for n in ("forward_step", "backward_step", "get_forward_backward_func", *SCHEDULES)
        if not callable(getattr(ms, n, None))
    ]
    if missing:
        raise IntegrationError(
            f"this megatron-core's schedules module has no {', '.join(missing)}: "
            "freeride cannot hook its compute"
        )
    if not set(SCHEDULES) <= code_names(ms.get_forward_backward_func):
        raise IntegrationError(
            "this megatron-core's get_forward_backward_func() does not return the module's "
            f"{', '.join(SCHEDULES)}: freeride cannot hook its iterations"
        )
    for name in SCHEDULES:
        if not {"forward_step", "backward_step"} & code_names(getattr(ms, name)):
            raise IntegrationError(
                f"this megatron-core's {name} calls neither forward_step nor backward_step "
                "of its module: freeride cannot hook its compute"
            )


def _model_config(ms: Any, args: tuple, kwargs: dict) -> Any:
    model = kwargs.get("model")
    if isinstance(model, (list, tuple)):
        model = model[0] if model else None
    if model is None:
        return None
    try:
        return ms.get_model_config(model)
    except Exception:  # noqa: BLE001 - the schedule itself will report a bad model
        return None


def _forward_label(args: tuple, kwargs: dict) -> str:
    mb = kwargs.get("current_microbatch", args[11] if len(args) > 11 else None)
    chunk = kwargs.get("vp_stage", args[12] if len(args) > 12 else None)
    label = "F" if mb is None else f"F mb{mb}"
    return label if chunk is None else f"{label} c{chunk}"


def attach(h: Any) -> Attachment:
    """Hooks megatron-core's pipeline schedules for harvester `h` (any rank's schedule:
    1F1B, interleaved, no pipelining) and closes the gate, so side work runs only inside
    the schedules' bubbles. Call before get_forward_backward_func() (megatron's
    train_step calls it every iteration). Replaces an earlier attachment (of this or
    another harvester) rather than stacking on it. Returns the attachment; its detach()
    restores the module exactly."""
    global _current
    check_harvester(h)
    ms = _schedules_module()
    with _lock:
        previous = _current
    if previous is not None:
        previous.detach()
    _check_module(ms)

    def forget() -> None:
        global _current
        with _lock:
            if _current is att:
                _current = None

    att = Attachment(h, "megatron", forget)

    def inside_iteration(args: tuple, kwargs: dict) -> None:
        if not att.in_iteration:
            raise IntegrationError(
                "megatron forward_step/backward_step ran outside a schedule freeride hooked: "
                "the forward-backward function was fetched from get_forward_backward_func() "
                "before fr.integrations.megatron.attach(); fetch it after attaching"
            )

    def before_schedule(name: str, args: tuple, kwargs: dict):
        config = _model_config(ms, args, kwargs)
        forward_only = bool(kwargs.get("forward_only", False))
        if (
            name in _COMBINED_1F1B
            and config is not None
            and getattr(config, "overlap_moe_expert_parallel_comm", False)
            and not forward_only
        ):
            raise IntegrationError(
                "config.overlap_moe_expert_parallel_comm runs megatron's combined 1F1B "
                "schedule (combined_1f1b.py), whose merged forward/backward steps freeride "
                "cannot hook; turn it off or detach() freeride"
            )
        finalize = getattr(config, "finalize_model_grads_func", None)
        if finalize is None or forward_only:
            return None
        label = att.compute(lambda a, k: "finalize_grads")
        wrapped = label(finalize)
        config.finalize_model_grads_func = wrapped

        def undo() -> None:
            if config.finalize_model_grads_func is wrapped:
                config.finalize_model_grads_func = finalize

        return undo

    try:
        att.patch(ms, "forward_step", att.compute(_forward_label, inside_iteration))
        att.patch(ms, "backward_step", att.compute(lambda a, k: "B", inside_iteration))
        for name in SCHEDULES:
            att.patch(
                ms,
                name,
                att.iteration(lambda a, k, _name=name: before_schedule(_name, a, k)),
            )
    except BaseException:
        att.detach()
        raise
    with _lock:
        _current = att
    close_gate(h)
    return att


def current() -> Attachment | None:
    """The attachment in place, if any."""
    return _current


def detach() -> None:
    """Detaches the attachment in place, if any."""
    att = _current
    if att is not None:
        att.detach()
