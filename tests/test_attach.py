"""attach() on a single-process schedule (one stage, gloo with world size 1): argument
errors, exact detach, optimizer hooks and the report of a real schedule."""

import gc
import json
import weakref

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

import freeride as fr


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    store = tmp_path_factory.mktemp("store") / "file"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def make_schedule(device="cpu"):
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
    stage = PipelineStage(module, 0, 1, torch.device(device))
    sched = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda o, t: ((o - t) ** 2).mean())
    return module, stage, sched


def callables(obj):
    return {k: v for k, v in vars(obj).items() if callable(v)}


def test_detach_restores_exactly(group, host):
    module, stage, sched = make_schedule()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    sched.step = sched.step  # an instance attribute that must come back as it was
    before = [(o, callables(o), set(vars(o))) for o in (sched, stage, opt)]
    host.attach(sched)
    host.attach_optimizer(opt)
    assert "forward_one_chunk" in vars(stage)
    host.detach()
    for obj, calls, keys in before:
        assert callables(obj) == calls
        assert set(vars(obj)) == keys


def test_a_dropped_attached_harvester_is_detached_and_closed(group):
    """The hooks attach() places hold nothing that keeps the harvester alive: dropped
    without close(), it is closed and the schedule is left as it was, without the
    cyclic GC."""
    module, stage, sched = make_schedule()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    before = [(o, callables(o), set(vars(o))) for o in (sched, stage, opt)]
    gc.disable()  # whatever passes here passes without the cyclic GC
    try:
        h = fr.Harvester("cpu", workers=2)
        h.attach(sched)
        h.attach_optimizer(opt)
        sched.step(torch.randn(4, 16), target=torch.randn(4, 16))  # the hooks ran
        opt.step()
        ex = h._ex
        ref = weakref.ref(h)
        del h
        assert ref() is None, "the attached schedule still holds the dropped harvester"
        assert ex.closed
    finally:
        gc.enable()
    for obj, calls, keys in before:
        assert callables(obj) == calls
        assert set(vars(obj)) == keys
    sched.step(torch.randn(4, 16), target=torch.randn(4, 16))  # training goes on


def test_report_of_a_real_schedule(group, host, tmp_path):
    module, _, sched = make_schedule()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    handle = host.submit(fr.tasks.Spin(10**9, 20_000))
    host.attach(sched)
    host.attach_optimizer(opt)
    assert not host.gate.is_open  # closed from attach() on, outside steps
    for _ in range(3):
        sched.step(torch.randn(4, 16), target=torch.randn(4, 16))
        assert not host.gate.is_open
        opt.step()
        assert not host.gate.is_open
    report = host.report()
    handle.cancel()
    assert len(report.iterations) == 3
    for it in report.iterations:
        labels = [c.label for c in it.compute]
        assert labels == [
            "F s0 mb0",
            "loss s0 mb0",
            "F s0 mb1",
            "loss s0 mb1",
            "B s0 mb0",
            "B s0 mb1",
        ]
        total = sum(b.duration_ns for b in it.bubbles) + sum(
            c.end_ns - c.start_ns for c in it.compute
        )
        assert total == it.duration_ns
        assert [b.slot for b in it.bubbles] == list(range(len(it.compute) + 1))
    assert 0.0 <= report.bubble_fraction <= 1.0
    assert "bubble fraction" in report.summary()
    report.to_chrome_trace(tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    d = report.to_dict()
    assert fr.Report.from_dict(json.loads(json.dumps(d))).total_ns == report.total_ns


def test_host_launches_start_in_bubbles_and_all_are_recorded(group):
    """The guide's one-rank pipeline (README, docs/guide.md) on the host backend: every recorded launch starts
    inside a bubble (a close does not wait for the items in flight, so it may end after
    the bubble, by the rest of an item); the first launch, which waited for the gate from
    before the first step, is in the record too; and the overhead estimate is the time
    the training thread spent in the hooks."""
    module, _, sched = make_schedule()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    with fr.Harvester("cpu", workers=2) as h:
        h.attach(sched)
        h.attach_optimizer(opt)
        handle = h.submit(fr.tasks.Spin(10**9, 20_000))  # before the first step
        # SCHED_IDLE workers get a core only when nothing else wants one: on a loaded
        # machine, step until items have run (bounded).
        for step in range(2000):
            sched.step(torch.randn(4, 16), target=torch.randn(4, 16))
            opt.step()
            if step >= 20 and handle.items_done > 0:
                break
        handle.cancel()  # returns once no item runs: every launch has ended
        report = h.report()
    assert handle.items_done > 0
    assert sum(report.items_per_task.values()) == handle.items_done
    bubbles = [b for it in report.iterations for b in it.bubbles]
    for launch in report.launches:
        assert launch.items > 0
        assert launch.start_ns <= launch.end_ns
        assert any(b.start_ns <= launch.start_ns <= b.end_ns for b in bubbles), launch
    assert all(it.hook_ns > 0 for it in report.iterations)
    assert report.estimated_overhead == pytest.approx(report.hook_ns / report.total_ns)
    assert 0 < report.estimated_overhead < 1


def test_attach_errors(group, host):
    _, _, sched = make_schedule()
    with pytest.raises(TypeError, match="torch.distributed.pipelining schedule"):
        host.attach(object())
    with pytest.raises(RuntimeError, match=r"attach\(schedule\) before"):
        host.attach_optimizer(torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1))
    host.attach(sched)
    with pytest.raises(RuntimeError, match="already attached"):
        host.attach(sched)
    with pytest.raises(TypeError, match="step"):
        host.attach_optimizer(object())
    host.detach()
    host.detach()  # idempotent
    host.close()
    with pytest.raises(fr.HarvesterClosedError):
        host.attach(sched)


def test_stage_on_another_device_is_refused(group, host):
    _, stage, sched = make_schedule()
    stage.device = torch.device("meta")
    with pytest.raises(ValueError, match="stage 0 is on meta but the harvester is on cpu"):
        host.attach(sched)
    assert "forward_one_chunk" not in vars(stage)


@pytest.mark.gpu
def test_gpu_schedule_side_kernels_only_between_compute(group, tmp_path):
    """A 16-wide model is host-bound on a GPU: its kernels take microseconds and the
    Python schedule milliseconds between them, so the GPU idles ~95% of each step. Those
    are real bubbles and side work fills them. (On an H100, Spin(10**9, 5 us) once
    finished inside the slow first step, before any iteration was recorded.)"""
    with fr.Harvester("cuda:0") as h:
        module, _, sched = make_schedule("cuda:0")
        module.cuda()
        h.attach(sched)

        def step():
            sched.step(
                torch.randn(64, 16, device="cuda"), target=torch.randn(64, 16, device="cuda")
            )

        for _ in range(2):  # warm-up: cuBLAS and allocator set-up, lazy kernel loads
            step()
        handle = h.submit(fr.tasks.Spin(2**40, 5_000))  # never finishes on its own
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        report = h.report()
        handle.cancel()
        assert len(report.iterations) == 7
        assert report.launches, "side kernels ran in the bubbles"
        harvested = sum(
            items
            for it in report.iterations[2:]
            for b in it.bubbles
            for items, _ in b.side.values()
        )
        assert harvested > 0
        assert report.bubble_fraction > 0.5  # host-bound: the GPU idles most of each step
        # Side launches may only overlap compute by the pause latency.
        assert report.side_ns_outside_bubbles <= 100_000 * sum(
            len(i.compute) for i in report.iterations
        )
        report.to_chrome_trace(tmp_path / "gpu_trace.json")


class Torch24Stage:
    """The stage API of torch 2.4: no backward_weight_one_chunk yet."""

    stage_index = 0
    device = torch.device("cpu")

    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None):
        return args

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True):
        return None


def test_attach_handles_the_torch_2_4_stage_api(group, host):
    _, _, sched = make_schedule()
    old = Torch24Stage()
    sched._stage = old  # single-stage schedules keep their stage here since 2.4
    host.attach(sched)
    assert set(vars(old)) == {"forward_one_chunk", "backward_one_chunk"}
    host.detach()
    assert vars(old) == {}
