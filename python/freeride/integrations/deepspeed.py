"""Harvesting the bubbles of a DeepSpeed PipelineEngine.

::

    import freeride as fr
    engine, *_ = deepspeed.initialize(model=pipeline_module, ...)
    att = fr.integrations.deepspeed.attach(h, engine)
    loss = engine.train_batch(data_iter)      # one iteration, side work in its bubbles
    att.detach()

A ``PipelineEngine`` runs its schedule instruction by instruction through the table
``_INSTRUCTION_MAP`` (instruction class -> ``_exec_*`` function), looked up on the engine
for every instruction. attach() gives this engine its own copy of the table (the class and
other engines keep theirs) in which every compute instruction (``ForwardPass``,
``BackwardPass``, ``OptimizerStep``, ``ReduceGrads``, ``ReduceTiedGrads``) runs inside
``h.compute()``; loading a microbatch and the point-to-point instructions (``Send*``,
``Recv*``, ``CommitP2P``) are the bubbles. ``train_batch()`` and ``eval_batch()`` are
iterations (``h.iteration()``). Works for subclasses such as ``DualPipeVEngine`` too.

Refused (IntegrationError): an engine that is no PipelineEngine, a table with an
instruction freeride does not know (it cannot tell whether it computes), an engine whose
``_exec_schedule`` does not run its instructions through the table, and a compute
instruction run outside train_batch()/eval_batch().
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ._common import Attachment, IntegrationError, check_harvester, close_gate, code_names

# Instruction class name -> compute label.
COMPUTE = {
    "ForwardPass": "F",
    "BackwardPass": "B",
    "OptimizerStep": "optimizer",
    "ReduceGrads": "reduce_grads",
    "ReduceTiedGrads": "reduce_tied_grads",
}
# Instructions that move data or wait for another stage: the bubbles.
NOT_COMPUTE = frozenset(
    {"LoadMicroBatch", "SendActivation", "RecvActivation", "SendGrad", "RecvGrad", "CommitP2P"}
)
ITERATIONS = ("train_batch", "eval_batch")

_lock = threading.Lock()
_attached: dict[int, weakref.ref] = {}  # id(engine) -> its attachment


def _pipeline_engine_class() -> type:
    try:
        from deepspeed.runtime.pipe.engine import PipelineEngine
    except ImportError as exc:
        raise ImportError(
            "fr.integrations.deepspeed needs deepspeed (pip install deepspeed)"
        ) from exc
    return PipelineEngine


def _label(kind: str):
    def label(args: tuple, kwargs: dict) -> str:
        buf = kwargs.get("buffer_id")
        phase = kwargs.get("phase")
        text = kind if buf is None else f"{kind} buf{buf}"
        return text if phase is None else f"{text} p{phase}"

    return label


def _check_engine(engine: Any) -> dict:
    cls = _pipeline_engine_class()
    if not isinstance(engine, cls):
        raise TypeError(
            "engine must be a DeepSpeed PipelineEngine (deepspeed.initialize() of a "
            f"PipelineModule); got {type(engine).__name__}"
        )
    if "_INSTRUCTION_MAP" not in code_names(type(engine)._exec_schedule):
        raise IntegrationError(
            f"{type(engine).__name__}._exec_schedule does not run its instructions through "
            "_INSTRUCTION_MAP: freeride cannot hook its compute"
        )
    table = engine._INSTRUCTION_MAP
    unknown = sorted(
        getattr(k, "__name__", repr(k))
        for k in table
        if getattr(k, "__name__", None) not in COMPUTE
        and getattr(k, "__name__", None) not in NOT_COMPUTE
    )
    if unknown:
        raise IntegrationError(
            f"{type(engine).__name__} runs instructions freeride does not know "
            f"({', '.join(unknown)}): it cannot tell whether they compute"
        )
    return table


def attach(h: Any, engine: Any) -> Attachment:
    """Hooks DeepSpeed PipelineEngine `engine` for harvester `h` and closes the gate, so
    side work runs only inside train_batch()/eval_batch() bubbles. Replaces an earlier
    attachment to the same engine (of this or another harvester) rather than stacking on
    it. Returns the attachment; its detach() restores the engine exactly."""
    check_harvester(h)
    _check_engine(engine)
    with _lock:
        ref = _attached.get(id(engine))
    previous = ref() if ref is not None else None
    if previous is not None:
        previous.detach()
    key = id(engine)

    def forget() -> None:
        with _lock:
            if _attached.get(key) is not None and _attached[key]() in (att, None):
                del _attached[key]

    att = Attachment(h, "deepspeed", forget)
    table = _check_engine(engine)

    def inside_iteration(args: tuple, kwargs: dict) -> None:
        if not att.in_iteration:
            raise IntegrationError(
                "a DeepSpeed compute instruction ran outside train_batch()/eval_batch(), "
                "which freeride hooks as iterations"
            )

    hooked = {}
    for instr, fn in table.items():
        kind = COMPUTE.get(instr.__name__)
        hooked[instr] = fn if kind is None else att.compute(_label(kind), inside_iteration)(fn)
    try:
        att.patch(engine, "_INSTRUCTION_MAP", lambda _table: hooked)
        for name in ITERATIONS:
            if callable(getattr(engine, name, None)):
                att.patch(engine, name, att.iteration())
    except BaseException:
        att.detach()
        raise
    with _lock:
        _attached[key] = weakref.ref(att)
    close_gate(h)
    return att


def current(engine: Any) -> Attachment | None:
    """The attachment in place on `engine`, if any."""
    ref = _attached.get(id(engine))
    att = ref() if ref is not None else None
    return att if att is not None and att.attached else None
