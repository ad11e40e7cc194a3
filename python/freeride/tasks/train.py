"""TrainModel: training a small PyTorch model in the bubbles, one optimizer step a step."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

from .._checks import check_count
from ..iterative import IterativeTask


class TrainModel(IterativeTask):
    """Trains `model` for `steps` optimizer steps on `batches` (an iterable of
    (inputs, targets) pairs, cycled), with `loss_fn(model(inputs), targets)`. Each step is
    one forward, backward and optimizer.step(); the harvester starts a step only in a
    bubble it is predicted to fit. The result is {"losses": [...], "model": model}.

    The model, its batches and the optimizer's memory are charged to the harvester's
    memory budget (parameters, gradients and two optimizer states per parameter, plus one
    batch)."""

    def __init__(
        self,
        model: Any,
        batches: Iterable[tuple[Any, Any]],
        optimizer: Any,
        loss_fn: Callable[[Any, Any], Any],
        steps: int,
    ) -> None:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
        if not callable(loss_fn):
            raise TypeError("loss_fn must be callable")
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.total_steps = check_count(steps, "steps")
        self._batches = batches
        self._iter: Any = None
        self.losses: list[float] = []
        params = list(model.parameters())
        if not params:
            raise ValueError("model has no parameters to train")
        devices = {p.device for p in params}
        if len(devices) != 1:
            raise ValueError(
                f"model parameters must be on one device, found {sorted(map(str, devices))}"
            )
        self.device = devices.pop()
        param_bytes = sum(p.numel() * p.element_size() for p in params)
        it = iter(batches)
        first = next(it, None)
        if first is None:
            raise ValueError("batches must not be empty")
        # A one-shot iterator (a generator) gave up its first batch to this look: train on
        # it too, before the rest.
        if it is batches:
            self._batches = itertools.chain([first], it)
        if not isinstance(first, (tuple, list)) or len(first) != 2:
            raise TypeError("batches must yield (inputs, targets) pairs")
        for name, t in zip(("inputs", "targets"), first):
            if hasattr(t, "device") and t.device != self.device:
                raise ValueError(
                    f"batch {name} are on {t.device} but the model is on {self.device}"
                )
        batch_bytes = sum(t.numel() * t.element_size() for t in first if hasattr(t, "numel"))
        self.memory_bytes = 4 * param_bytes + batch_bytes

    def bind(self, kind: str, device: int) -> None:
        """Checks the model lives on the harvester's device (called at submit)."""
        want = "cpu" if kind == "host" else "cuda"
        ok = self.device.type == want and (want == "cpu" or (self.device.index or 0) == device)
        if not ok:
            where = "cpu" if kind == "host" else f"cuda:{device}"
            raise ValueError(f"model is on {self.device} but the harvester is on {where}")

    def setup(self) -> None:
        self.model.train()
        self._iter = itertools.cycle(self._batches)

    def step(self) -> None:
        inputs, targets = next(self._iter)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(inputs), targets)
        loss.backward()
        self.optimizer.step()
        self.losses.append(float(loss.detach()))

    def finished(self) -> bool:
        return len(self.losses) >= self.total_steps

    def result(self) -> dict[str, Any]:
        return {"losses": list(self.losses), "model": self.model}

    def __repr__(self) -> str:
        return f"TrainModel({type(self.model).__name__}, steps={self.total_steps})"
