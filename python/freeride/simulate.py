"""A pipeline schedule simulator: where the bubbles of a schedule fall, given per-action
times. The GPU stage emulator of `freeride bench pipeline` replays it, and it answers how
much of a large job's GPU time is harvestable.

Action orders come from torch.distributed.pipelining itself for the multi-stage
schedules (their pipeline_order tables, built with stand-in stages), and from the same
loops torch runs for the single-stage ones (GPipe, 1F1B), so the simulation follows the
schedule PyTorch executes. Each rank runs its actions in order; an action starts when
its rank is free and its inputs have arrived:

- F(s, m) after F(s-1, m) (+ `t_comm` when s-1 is on another rank);
- B(s, m) or I(s, m) after F(s, m), and after B/I(s+1, m) (+ `t_comm`) unless s is last;
- W(s, m) after I(s, m).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._checks import check_count, check_float

# name -> (torch class, stages per rank, placement: "loop" (rank r holds r, r+R, ...)
# or "v" (rank r holds r and 2R-1-r))
SCHEDULES: dict[str, tuple[str, int, str]] = {
    "gpipe": ("ScheduleGPipe", 1, "loop"),
    "1f1b": ("Schedule1F1B", 1, "loop"),
    "interleaved": ("ScheduleInterleaved1F1B", 2, "loop"),
    "looped_bfs": ("ScheduleLoopedBFS", 2, "loop"),
    "zero_bubble": ("ScheduleInterleavedZeroBubble", 2, "loop"),
    "zbv": ("ScheduleZBVZeroBubble", 2, "v"),
    "dualpipev": ("ScheduleDualPipeV", 2, "v"),
}


@dataclass(frozen=True)
class Action:
    """One compute action of the schedule: kind F, B (full backward), I (backward
    input) or W (backward weight), on `stage` for microbatch `mb`."""

    kind: str
    stage: int
    mb: int

    @property
    def label(self) -> str:
        """The label freeride's bubble record gives the same action."""
        return f"{self.kind} s{self.stage} mb{self.mb}"


@dataclass
class RankTimeline:
    """One rank's simulated iteration."""

    rank: int
    actions: list[tuple[Action, float, float]] = field(default_factory=list)  # (action, start, end)
    makespan: float = 0.0

    @property
    def busy(self) -> float:
        return sum(end - start for _, start, end in self.actions)

    @property
    def bubbles(self) -> list[tuple[float, float]]:
        """Gaps between actions, from the iteration's start to its end (the makespan)."""
        gaps, t = [], 0.0
        for _, start, end in self.actions:
            if start > t:
                gaps.append((t, start))
            t = max(t, end)
        if self.makespan > t:
            gaps.append((t, self.makespan))
        return gaps

    @property
    def bubble_fraction(self) -> float:
        return 1.0 - self.busy / self.makespan if self.makespan > 0 else 0.0


@dataclass
class Simulation:
    """A simulated iteration of every rank."""

    schedule: str
    ranks: list[RankTimeline]
    microbatches: int
    times: dict[str, float]

    @property
    def makespan(self) -> float:
        return max(r.makespan for r in self.ranks)

    @property
    def bubble_fraction(self) -> float:
        """Share of all ranks' time that is bubble."""
        return sum(r.bubble_fraction for r in self.ranks) / len(self.ranks)

    def table(self) -> str:
        """Per-rank busy time, bubble time and bubble fraction."""
        lines = [f"{'rank':>4}  {'busy':>10}  {'bubbles':>10}  {'fraction':>8}"]
        for r in self.ranks:
            lines.append(
                f"{r.rank:>4}  {r.busy:>10.3f}  {self.makespan - r.busy:>10.3f}  "
                f"{r.bubble_fraction:>8.1%}"
            )
        lines.append(
            f"all   makespan {self.makespan:.3f}, bubble fraction {self.bubble_fraction:.1%}"
        )
        return "\n".join(lines)


def stage_ids(schedule: str, rank: int, ranks: int) -> list[int]:
    """Stages rank `rank` holds under `schedule`."""
    _, per_rank, placement = _spec(schedule)
    if per_rank == 1:
        return [rank]
    if placement == "v":
        return [rank, 2 * ranks - 1 - rank]
    return [rank + k * ranks for k in range(per_rank)]


def _spec(schedule: str) -> tuple[str, int, str]:
    if not isinstance(schedule, str):
        raise TypeError(f"schedule must be a str, one of {sorted(SCHEDULES)}, got {schedule!r}")
    key = schedule.lower()
    if key not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")
    return SCHEDULES[key]


def schedule_order(schedule: str, ranks: int, microbatches: int) -> dict[int, list[Action]]:
    """Every rank's compute actions in the order its schedule runs them."""
    check_count(ranks, "ranks")
    check_count(microbatches, "microbatches")
    cls_name, per_rank, _ = _spec(schedule)
    num_stages = ranks * per_rank
    if per_rank == 1:
        return {
            r: _single_stage_order(schedule.lower(), r, num_stages, microbatches)
            for r in range(ranks)
        }
    return _torch_order(cls_name, schedule, ranks, microbatches, num_stages)


def _single_stage_order(schedule: str, stage: int, num_stages: int, m: int) -> list[Action]:
    if schedule == "gpipe":  # ScheduleGPipe: every forward, then every backward
        return [Action("F", stage, i) for i in range(m)] + [Action("B", stage, i) for i in range(m)]
    # Schedule1F1B._step_microbatches: warm-up forwards, then backward/forward pairs, then
    # the remaining backwards.
    warmup = min(m, num_stages - stage)
    order = [Action("F", stage, i) for i in range(warmup)]
    fwd, bwd = warmup, 0
    while True:
        order.append(Action("B", stage, bwd))
        bwd += 1
        if fwd == m:
            break
        order.append(Action("F", stage, fwd))
        fwd += 1
    order += [Action("B", stage, i) for i in range(bwd, m)]
    return order


class _StandInStage:
    """What torch's multi-stage schedules read of a stage to build their tables."""

    submod = None

    def __init__(self, index: int, num_stages: int, rank: int, ranks: int) -> None:
        self.stage_index = index
        self.num_stages = num_stages
        self.group_rank = rank
        self.group_size = ranks
        self.is_first = index == 0
        self.is_last = index == num_stages - 1
        self.stage_index_to_group_rank: Any = None


def _torch_order(cls_name: str, schedule: str, ranks: int, m: int, num_stages: int):
    try:
        from torch.distributed.pipelining import schedules
    except ImportError as exc:
        raise ImportError(f"simulating {schedule!r} needs torch >= 2.4") from exc
    cls = getattr(schedules, cls_name, None)
    if cls is None:
        raise ValueError(f"this torch has no {cls_name}")
    stages = [_StandInStage(i, num_stages, 0, ranks) for i in stage_ids(schedule, 0, ranks)]
    sched = cls(stages, n_microbatches=m, loss_fn=lambda out, target: out)
    order: dict[int, list[Action]] = {}
    for rank, actions in sched.pipeline_order.items():
        flat: list[Action] = []
        for action in actions:
            if action is None:
                continue
            subs = getattr(action, "sub_actions", None) or (action,)
            for sub in subs:
                kind = _KINDS.get(str(sub.computation_type))
                if kind is not None:
                    flat.append(Action(kind, sub.stage_index, sub.microbatch_index))
        order[rank] = flat
    return order


_KINDS = {
    "_ComputationType.FORWARD": "F",
    "_ComputationType.FULL_BACKWARD": "B",
    "_ComputationType.BACKWARD_INPUT": "I",
    "_ComputationType.BACKWARD_WEIGHT": "W",
    "F": "F",
    "B": "B",
    "I": "I",
    "W": "W",
}


def simulate(
    schedule: str = "1f1b",
    ranks: int = 4,
    microbatches: int = 8,
    t_forward: float = 1.0,
    t_backward: float = 2.0,
    t_backward_input: float | None = None,
    t_backward_weight: float | None = None,
    t_comm: float = 0.0,
) -> Simulation:
    """Simulates one iteration of `schedule` on `ranks` pipeline ranks with
    `microbatches` microbatches. Times are in any unit (all the same): a forward, a full
    backward, its input and weight halves (default: half a backward each), and the
    latency of a send between ranks."""
    # Finite and >= 0: a negative, infinite or NaN time gives a makespan and bubble
    # fraction that mean nothing (a fraction of 9.0, or NaN).
    t_forward, t_backward, t_comm = (
        _duration(value, name)
        for name, value in (
            ("t_forward", t_forward),
            ("t_backward", t_backward),
            ("t_comm", t_comm),
        )
    )
    t_in = (
        t_backward / 2
        if t_backward_input is None
        else _duration(t_backward_input, "t_backward_input")
    )
    t_w = (
        t_backward / 2
        if t_backward_weight is None
        else _duration(t_backward_weight, "t_backward_weight")
    )
    duration = {"F": t_forward, "B": t_backward, "I": t_in, "W": t_w}
    order = schedule_order(schedule, ranks, microbatches)
    num_stages = ranks * _spec(schedule)[1]
    owner = {s: r for r in range(ranks) for s in stage_ids(schedule, r, ranks)}
    done: dict[tuple[str, int, int], float] = {}
    timelines = {r: RankTimeline(r) for r in order}
    position = {r: 0 for r in order}
    free = {r: 0.0 for r in order}

    def ready(action: Action, rank: int) -> float | None:
        """When the action's inputs are there, or None while one is not computed."""
        deps: list[tuple[tuple[str, int, int], float]] = []
        s, m = action.stage, action.mb
        if action.kind == "F":
            if s > 0:
                deps.append((("F", s - 1, m), _hop(owner, s - 1, s, t_comm)))
        elif action.kind in ("B", "I"):
            deps.append((("F", s, m), 0.0))
            if s < num_stages - 1:
                deps.append((("bwd", s + 1, m), _hop(owner, s + 1, s, t_comm)))
        else:
            deps.append((("I", s, m), 0.0))
        t = 0.0
        for key, latency in deps:
            if key not in done:
                return None
            t = max(t, done[key] + latency)
        return t

    remaining = sum(len(a) for a in order.values())
    while remaining:
        progressed = False
        for rank, actions in order.items():
            while position[rank] < len(actions):
                action = actions[position[rank]]
                t = ready(action, rank)
                if t is None:
                    break
                start = max(t, free[rank])
                end = start + duration[action.kind]
                timelines[rank].actions.append((action, start, end))
                free[rank] = end
                done[(action.kind, action.stage, action.mb)] = end
                if action.kind in ("B", "I"):
                    done[("bwd", action.stage, action.mb)] = end
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: order[r][position[r]].label for r in order if position[r] < len(order[r])}
            raise RuntimeError(f"the schedule cannot make progress (waiting: {stuck})")
    makespan = max(free.values())
    for tl in timelines.values():
        tl.makespan = makespan
    return Simulation(schedule, [timelines[r] for r in sorted(timelines)], microbatches, duration)


def _hop(owner: dict[int, int], src: int, dst: int, t_comm: float) -> float:
    return t_comm if owner[src] != owner[dst] else 0.0


def _duration(value: Any, name: str) -> float:
    value = check_float(value, name)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def harvestable_share(
    gpus: int = 1000,
    tensor_parallel: int = 8,
    pipeline_parallel: int = 5,
    schedule: str = "1f1b",
    microbatches: int = 16,
    t_forward: float = 1.0,
    t_backward: float = 2.0,
    t_comm: float = 0.05,
    dp_sync: float = 0.0,
) -> dict[str, Any]:
    """How much of a job's GPU time is harvestable. The job has `gpus` GPUs in tensor-,
    pipeline- and data-parallel groups (data parallelism takes what is left). Every GPU
    of a tensor-parallel group shares its stage's timeline and every data-parallel replica
    repeats it, so the harvestable share is the pipeline's bubble share; `dp_sync` adds
    the data-parallel gradient all-reduce after each iteration as idle time of every
    stage (in the same unit as the action times)."""
    check_count(gpus, "gpus")
    check_count(tensor_parallel, "tensor_parallel")
    check_count(pipeline_parallel, "pipeline_parallel")
    dp_sync = _duration(dp_sync, "dp_sync")
    if gpus % (tensor_parallel * pipeline_parallel) != 0:
        raise ValueError(
            f"gpus ({gpus}) must be a multiple of tensor_parallel * pipeline_parallel "
            f"({tensor_parallel * pipeline_parallel})"
        )
    data_parallel = gpus // (tensor_parallel * pipeline_parallel)
    sim = simulate(schedule, pipeline_parallel, microbatches, t_forward, t_backward, t_comm=t_comm)
    busy = sum(r.busy for r in sim.ranks) / len(sim.ranks)
    iteration = sim.makespan + (dp_sync if data_parallel > 1 else 0.0)
    share = 1.0 - busy / iteration
    return {
        "gpus": gpus,
        "tensor_parallel": tensor_parallel,
        "pipeline_parallel": pipeline_parallel,
        "data_parallel": data_parallel,
        "schedule": schedule,
        "microbatches": microbatches,
        "iteration": iteration,
        "bubble_fraction": share,
        "harvestable_gpu_hours_per_hour": share * gpus,
        "per_stage": [1.0 - r.busy / iteration for r in sim.ranks],
    }
