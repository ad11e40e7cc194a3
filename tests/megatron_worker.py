"""megatron-core's own pipeline schedules on CPU ranks (gloo) for the integration tests.
Each rank trains a few steps without harvesting and the same steps harvested through
fr.integrations.megatron, then checks replacement, refusal and exact detach; the parent
test reads the JSON each rank writes. The CPU stand-ins stay in these rank processes."""

from __future__ import annotations

from integration_common import (
    MAX_EXTRA_STEPS,
    all_progressed,
    cpu_patches,
    run_and_report,
    side_summary,
    side_task,
)

import freeride as fr
from freeride.cli.spawn import join_group

D = 16  # hidden size
MB = 4  # microbatch size
N_MICRO = 4


class GateProbe:
    """A config.timers stand-in: megatron times every forward-compute, backward-compute
    and p2p region through it, so it records whether the gate was open at each edge."""

    def __init__(self, h=None) -> None:
        self.h = h
        self.events: list[tuple[str, str, bool | None]] = []

    def __call__(self, name: str, log_level: int | None = None) -> _Timer:
        return _Timer(self, name)

    def finalize_model_grads(self, *args, **kwargs) -> None:
        """A config.finalize_model_grads_func stand-in (megatron's would all-reduce)."""
        _Timer(self, "finalize-grads")._event("call")


class _Timer:
    def __init__(self, probe: GateProbe, name: str) -> None:
        self.probe, self.name = probe, name

    def _event(self, edge: str) -> None:
        is_open = None if self.probe.h is None else self.probe.h.gate.is_open
        self.probe.events.append((self.name, edge, is_open))

    def start(self, barrier: bool = False) -> None:
        self._event("start")

    def stop(self, barrier: bool = False) -> None:
        self._event("stop")


def _stage_class():
    import torch
    from megatron.core.enums import ModelType

    class Stage(torch.nn.Module):
        """One pipeline stage: megatron's schedules need config, model_type and
        set_input_tensor (the activation received from the previous stage)."""

        def __init__(self, config, index: int, num_stages: int) -> None:
            super().__init__()
            self.config = config
            self.model_type = ModelType.encoder_or_decoder
            self.first = index == 0
            torch.manual_seed(1000 + index)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(D, 2 * D), torch.nn.Tanh(), torch.nn.Linear(2 * D, D)
            )
            self.input_tensor = None

        def set_input_tensor(self, tensor) -> None:
            self.input_tensor = tensor[0] if isinstance(tensor, list) else tensor

        def forward(self, x):
            return self.net(x if self.first else self.input_tensor)

    return Stage


def _forward_step(data_iterator, model):
    x, y = next(data_iterator)
    out = model(x)

    def loss_func(output):
        loss = ((output - y) ** 2).mean()
        return loss, {"loss": loss.detach()}

    return out, loss_func


def train(ms, config, rank, world, vp, steps, probe=None, fetch=None, more=None):
    """`steps` training steps (schedule + SGD step) on fresh, seeded stages; returns each
    step's losses (last stage) and the weights after them. With `more`, goes on training
    while more() says so (up to MAX_EXTRA_STEPS more)."""
    import torch

    chunks = vp or 1
    stage_cls = _stage_class()
    models = [stage_cls(config, rank + c * world, world * chunks) for c in range(chunks)]
    params = [p for m in models for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=0.05)
    g = torch.Generator().manual_seed(7)
    config.timers = probe
    config.finalize_model_grads_func = probe.finalize_model_grads if probe else None
    losses = []
    weights = None
    try:
        for step in range(steps + MAX_EXTRA_STEPS):
            if step == steps:
                weights = [p.detach().clone() for p in params]
                if more is None or not more():
                    break
            elif step > steps and not more():
                break
            batches = [
                (torch.randn(1, MB, D, generator=g), torch.randn(1, MB, D, generator=g))
                for _ in range(N_MICRO)
            ]
            iters = [iter(batches) for _ in models]
            opt.zero_grad()
            fb = fetch if fetch is not None else ms.get_forward_backward_func()
            out = fb(
                forward_step_func=_forward_step,
                data_iterator=iters if vp else iters[0],
                model=models if vp else models[0],
                num_microbatches=N_MICRO,
                seq_length=1,
                micro_batch_size=MB,
            )
            opt.step()
            if step < steps:
                losses.append([float(d["loss"]) for d in out])
    finally:
        res_finalize = config.finalize_model_grads_func
        config.timers = config.finalize_model_grads_func = None
    if probe is not None:
        probe.finalize_restored = res_finalize == probe.finalize_model_grads
    return losses, weights


def _body(rank: int, world: int, vp: int | None, steps: int, outdir: str, res: dict) -> None:
    cpu_patches()
    import torch

    join_group(rank, world, outdir)
    torch.set_num_threads(1)
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import schedules as ms
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(1, world, virtual_pipeline_model_parallel_size=vp)
    config = TransformerConfig(
        num_layers=world * (vp or 1),
        hidden_size=D,
        num_attention_heads=1,
        pipeline_model_parallel_size=world,
        virtual_pipeline_model_parallel_size=vp,
        pipeline_dtype=torch.float32,
        # What Megatron-LM uses with virtual stages (batched p2p with 2 ranks and virtual
        # stages is wrong upstream: Megatron-LM issue 1450).
        batch_p2p_comm=False,
        overlap_p2p_comm=vp is not None,
    )
    module_before = dict(vars(ms))
    base_losses, base_weights = train(ms, config, rank, world, vp, steps, GateProbe())
    res["schedule"] = ms.get_forward_backward_func().__name__

    with fr.Harvester("cpu", workers=1) as h:
        task = side_task()
        handle = h.submit(task)
        att = fr.integrations.megatron.attach(h)
        res["gate_closed_after_attach"] = not h.gate.is_open
        probe = GateProbe(h)
        more = (lambda: not all_progressed(handle)) if world > 1 else None
        losses, weights = train(ms, config, rank, world, vp, steps, probe, more=more)
        res.update(side_summary(h, task, handle))
        res["identical"] = losses == base_losses and all(
            torch.equal(a, b) for a, b in zip(weights, base_weights)
        )
        res["base_losses"] = base_losses
        compute = [e for e in probe.events if e[0] in ("forward-compute", "backward-compute")]
        p2p = [e for e in probe.events if "send" in e[0] or "recv" in e[0]]
        res["compute_regions"] = len(compute)
        res["compute_regions_gate_open"] = sum(1 for e in compute if e[2])
        res["p2p_regions"] = len(p2p)
        res["p2p_regions_gate_closed"] = sum(1 for e in p2p if not e[2])
        finalize = [e for e in probe.events if e[0] == "finalize-grads"]
        res["finalize_calls"] = len(finalize)
        res["finalize_gate_open"] = sum(1 for e in finalize if e[2])
        res["finalize_restored"] = probe.finalize_restored
        res["forward_regions"] = sum(
            1 for e in compute if e[0] == "forward-compute" and e[1] == "start"
        )
        res["backward_regions"] = sum(
            1 for e in compute if e[0] == "backward-compute" and e[1] == "start"
        )

        # A second attach (another harvester) replaces the first; never stacks.
        with fr.Harvester("cpu", workers=1) as h2:
            att2 = fr.integrations.megatron.attach(h2)
            res["replaced"] = (
                not att.attached
                and att2.attached
                and ms.forward_step.__wrapped__ is module_before["forward_step"]
                and fr.integrations.megatron.current() is att2
            )
            att2 = fr.integrations.megatron.attach(h2)  # the same harvester again
            res["replaced_same"] = ms.forward_step.__wrapped__ is module_before["forward_step"]
            if vp is not None or world == 1:
                # The combined 1F1B path is refused before the schedule runs anything.
                config.overlap_moe_expert_parallel_comm = True
                try:
                    train(ms, config, rank, world, vp, 1)
                    res["refused"] = None
                except fr.integrations.IntegrationError as exc:
                    res["refused"] = str(exc)
                finally:
                    config.overlap_moe_expert_parallel_comm = False
            if world == 1:
                # A schedule fetched before attach() runs forward_step outside any hooked
                # iteration: refused at its first forward, not silently unharvested.
                att2.detach()
                stale = ms.get_forward_backward_func()
                att2 = fr.integrations.megatron.attach(h2)
                try:
                    train(ms, config, rank, world, vp, 1, fetch=stale)
                    res["stale_refused"] = None
                except fr.integrations.IntegrationError as exc:
                    res["stale_refused"] = str(exc)
            closed = fr.Harvester("cpu", workers=1)
            closed.close()
            try:
                fr.integrations.megatron.attach(closed)
                res["closed_refused"] = False
            except fr.HarvesterClosedError:  # refused before touching att2
                res["closed_refused"] = fr.integrations.megatron.current() is att2
            att2.detach()
            att2.detach()  # idempotent
        res["detach_restores"] = _same(vars(ms), module_before)

        # Hooks of a harvester closed while attached pass through and remove themselves.
        h3 = fr.Harvester("cpu", workers=1)
        att3 = fr.integrations.megatron.attach(h3)
        h3.close()
        again, _ = train(ms, config, rank, world, vp, steps)
        res["closed_passthrough"] = again == base_losses and not att3.attached
        res["closed_restores"] = _same(vars(ms), module_before)


def _same(now: dict, before: dict) -> bool:
    return now.keys() == before.keys() and all(now[k] is v for k, v in before.items())


def run_rank(rank: int, world: int, vp: int | None, steps: int, outdir: str) -> None:
    run_and_report(rank, outdir, lambda res: _body(rank, world, vp, steps, outdir, res))
