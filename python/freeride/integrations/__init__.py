"""Attaching a harvester to training engines that do not use torch.distributed.pipelining.

``fr.integrations.megatron.attach(h)`` hooks megatron-core's pipeline schedules (1F1B,
interleaved, no pipelining); ``fr.integrations.deepspeed.attach(h, engine)`` hooks one
DeepSpeed ``PipelineEngine``. Each returns an :class:`Attachment`; ``detach()`` puts
every hooked object back exactly as it was, and attaching again replaces the previous
attachment instead of stacking on it. Neither module imports its engine until used.
"""

from __future__ import annotations

from ._common import Attachment, IntegrationError

__all__ = ["Attachment", "IntegrationError", "deepspeed", "megatron"]


def __getattr__(name: str):  # the engines' modules load on first use
    if name in ("megatron", "deepspeed"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
