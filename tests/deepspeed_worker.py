"""A DeepSpeed PipelineEngine on two CPU ranks (gloo) for the integration tests. Each rank
trains a few batches without harvesting and the same batches harvested through
fr.integrations.deepspeed, then checks replacement, refusal and exact detach; the parent
test reads the JSON each rank writes."""

from __future__ import annotations

import os

from integration_common import (
    MAX_EXTRA_STEPS,
    all_progressed,
    run_and_report,
    side_summary,
    side_task,
)

from freeride.cli.spawn import join_group

D = 16
MB = 4
N_MICRO = 4


def _engine(world: int):
    import deepspeed
    import torch
    from deepspeed.pipe import LayerSpec, PipelineModule

    torch.manual_seed(1234)
    layers = [
        LayerSpec(torch.nn.Linear, D, 2 * D),
        LayerSpec(torch.nn.Tanh),
        LayerSpec(torch.nn.Linear, 2 * D, D),
        LayerSpec(torch.nn.Tanh),
        LayerSpec(torch.nn.Linear, D, D),
    ]
    module = PipelineModule(
        layers=layers,
        num_stages=world,
        loss_fn=lambda out, y: ((out - y) ** 2).mean(),
        partition_method="uniform",
    )
    config = {
        "train_micro_batch_size_per_gpu": MB,
        "gradient_accumulation_steps": N_MICRO,
        "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    engine, *_ = deepspeed.initialize(
        model=module, model_parameters=[p for p in module.parameters()], config=config
    )
    return engine


def train(engine, steps, more=None):
    """`steps` train_batch() calls on seeded batches; returns their losses and the weights
    after them. With `more`, goes on while more() says so (up to MAX_EXTRA_STEPS more)."""
    import torch

    g = torch.Generator().manual_seed(7)
    losses = []
    weights = None
    for step in range(steps + MAX_EXTRA_STEPS):
        if step == steps:
            weights = [p.detach().clone() for p in engine.module.parameters()]
            if more is None or not more():
                break
        elif step > steps and not more():
            break
        batches = [
            (torch.randn(MB, D, generator=g), torch.randn(MB, D, generator=g))
            for _ in range(N_MICRO)
        ]
        loss = float(engine.train_batch(iter(batches)))
        if step < steps:
            losses.append(loss)
    return losses, weights


def _body(rank: int, world: int, steps: int, outdir: str, res: dict) -> None:
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("LOCAL_RANK", str(rank))
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world)
    import torch

    join_group(rank, world, outdir)
    torch.set_num_threads(1)
    import sys

    import deepspeed
    import deepspeed.comm.torch

    # The CPU accelerator would JIT-compile its shared-memory all-reduce op (about a
    # minute on two cores); gloo does the reductions here.
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")

    from deepspeed.runtime.pipe import schedule
    from deepspeed.runtime.pipe.engine import PipelineEngine

    import freeride as fr

    class_map = dict(PipelineEngine._INSTRUCTION_MAP)
    base_losses, base_weights = train(_engine(world), steps)
    res["base_losses"] = base_losses

    engine = _engine(world)
    before = _attrs(engine)
    with fr.Harvester("cpu", workers=1) as h:
        # attach + detach alone leaves the engine exactly as it was
        fr.integrations.deepspeed.attach(h, engine).detach()
        res["detach_restores_untrained"] = _attrs(engine) == before

        task = side_task()
        handle = h.submit(task)
        att = fr.integrations.deepspeed.attach(h, engine)
        res["gate_closed_after_attach"] = not h.gate.is_open
        # Every layer's forward runs with the gate closed (inside a compute action).
        seen = []
        hooks = [
            m.register_forward_pre_hook(lambda *a: seen.append(h.gate.is_open))
            for m in engine.module.modules()
        ]
        losses, weights = train(engine, steps, more=lambda: not all_progressed(handle))
        for hook in hooks:
            hook.remove()
        res["forwards_seen"] = len(seen)
        res["forwards_gate_open"] = sum(seen)
        res.update(side_summary(h, task, handle))
        res["identical"] = losses == base_losses and all(
            torch.equal(a, b) for a, b in zip(weights, base_weights)
        )

        # A second attach (another harvester) replaces the first; never stacks.
        with fr.Harvester("cpu", workers=1) as h2:
            att2 = fr.integrations.deepspeed.attach(h2, engine)
            fwd = engine._INSTRUCTION_MAP[schedule.ForwardPass]
            res["replaced"] = (
                not att.attached
                and att2.attached
                and fwd.__wrapped__ is class_map[schedule.ForwardPass]
                and fr.integrations.deepspeed.current(engine) is att2
            )
            att2.detach()
            att2.detach()  # idempotent
        trained = _attrs(engine)
        res["detach_restores"] = (
            "_INSTRUCTION_MAP" not in trained
            and "train_batch" not in trained
            and "eval_batch" not in trained
            and PipelineEngine._INSTRUCTION_MAP == class_map
        )

        # Refusals: not a pipeline engine; an instruction freeride does not know.
        try:
            fr.integrations.deepspeed.attach(h, torch.nn.Linear(1, 1))
            res["refused_type"] = None
        except TypeError as exc:
            res["refused_type"] = str(exc)

        class Prefetch(schedule.PipeInstruction):
            pass

        engine._INSTRUCTION_MAP = {**class_map, Prefetch: lambda self: None}
        try:
            fr.integrations.deepspeed.attach(h, engine)
            res["refused_unknown"] = None
        except fr.integrations.IntegrationError as exc:
            res["refused_unknown"] = str(exc)
        finally:
            del engine._INSTRUCTION_MAP

    # Hooks of a harvester closed while attached pass through and remove themselves.
    engine = _engine(world)
    before = _attrs(engine)
    h3 = fr.Harvester("cpu", workers=1)
    att3 = fr.integrations.deepspeed.attach(h3, engine)
    h3.close()
    again, _ = train(engine, steps)
    res["closed_passthrough"] = again == base_losses and not att3.attached
    res["closed_restores"] = not {"_INSTRUCTION_MAP", "train_batch"} & set(vars(engine))


def _attrs(engine) -> dict:
    """The engine's own attributes, by identity."""
    return {k: id(v) for k, v in vars(engine).items()}


def run_rank(rank: int, world: int, steps: int, outdir: str) -> None:
    run_and_report(rank, outdir, lambda res: _body(rank, world, steps, outdir, res))
