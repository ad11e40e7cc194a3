"""Report: totals, text, dict round trip, Chrome trace and PNG, all from synthetic records
whose every number is worked out by hand below."""

import json
import sys

import pytest

import freeride as fr
from freeride.record.model import Bubble, Compute, Iteration, SideLaunch, TaskSummary
from freeride.record.report import Report, merge_chrome_traces

US = 1_000  # ns

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_report(rank=0, backend="cuda") -> Report:
    """Two 100 us iterations (times in us):

    it0: b0 0-10 | F 10-40 | b1 40-50 | B 50-90 | b2 90-100     bubbles 30, compute 70
    it1: b0 100-120 | F 120-150 | b1 150-160 | B 160-190 | b2 190-200   bubbles 40, compute 60

    Launches (task 0 = "Spin(a)", task 1 = "Train(b)"):
      L1 t0  2-8     inside it0 b0
      L2 t0  45-52   5 in it0 b1, 2 in compute B (straddles B's start)
      L3 t1  95-105  5 in it0 b2, 5 in it1 b0
      L4 t1  102-110 concurrent with L3, in it1 b0
      L6 t1  115-121 5 in it1 b0, 1 in F (straddles F's start)
      L5 t0  118-125 2 in it1 b0, 5 in F (straddles F's start, ends later than L6)
      L7 t0  170-172 starts inside compute B of it1
    """
    it0 = Iteration(
        index=0,
        start_ns=0,
        end_ns=100 * US,
        compute=[
            Compute(10 * US, 40 * US, "F s0 mb0"),
            Compute(50 * US, 90 * US, "B s0 mb0"),
        ],
        bubbles=[
            Bubble(0, 0, 0, 10 * US, free_memory=1000, side={0: (6.0, 6 * US)}),
            Bubble(0, 1, 40 * US, 50 * US, side={0: (5.0, 5 * US)}),
            Bubble(0, 2, 90 * US, 100 * US, side={1: (5.0, 5 * US)}),
        ],
    )
    it1 = Iteration(
        index=1,
        start_ns=100 * US,
        end_ns=200 * US,
        compute=[
            Compute(120 * US, 150 * US, "F s0 mb1"),
            Compute(160 * US, 190 * US, "B s0 mb1"),
        ],
        bubbles=[
            Bubble(1, 0, 100 * US, 120 * US, free_memory=3000, side={1: (12.5, 15 * US)}),
            Bubble(1, 1, 150 * US, 160 * US, free_memory=500),
            Bubble(1, 2, 190 * US, 200 * US),
        ],
    )
    launches = [
        SideLaunch(0, "Spin(a)", 0, 2 * US, 8 * US, 6),
        SideLaunch(0, "Spin(a)", 0, 45 * US, 52 * US, 7),
        SideLaunch(1, "Train(b)", 0, 95 * US, 105 * US, 10),
        SideLaunch(1, "Train(b)", 1, 102 * US, 110 * US, 8),
        SideLaunch(1, "Train(b)", 1, 115 * US, 121 * US, 2),
        SideLaunch(0, "Spin(a)", 1, 118 * US, 125 * US, 3),
        SideLaunch(0, "Spin(a)", 2, 170 * US, 172 * US, 1),
    ]
    tasks = [
        TaskSummary(0, "Spin(a)", "done", 17, 17),
        TaskSummary(1, "Train(b)", "running", 20, None, overruns=2),
    ]
    return Report(
        device="cuda:0" if backend == "cuda" else "cpu",
        backend=backend,
        rank=rank,
        iterations=[it0, it1],
        launches=launches,
        tasks=tasks,
        settings={"workers": 4, "schedule": "1F1B"},
    )


# ------------------------------------------------------------------------- totals


def test_time_totals():
    r = make_report()
    assert r.total_ns == 200 * US
    assert r.compute_ns == 130 * US
    assert r.bubble_ns == 70 * US
    assert r.bubble_fraction == pytest.approx(0.35)


def test_harvested_counts_partial_and_concurrent_overlaps_once():
    r = make_report()
    # it0 b0: 6 (L1); it0 b1: 5 (L2 up to 50); it0 b2: 5 (L3 from 95);
    # it1 b0: L3 ∪ L4 = 100-110, L6 ∪ L5 = 115-120 -> 15.
    assert r.harvested_ns == 31 * US
    assert r.harvested_ns <= r.bubble_ns
    # task 0: L1 6 + L2 5 + L5 2; task 1: (L3 ∪ L4) 5 + 10, L6 5.
    assert r.harvested_ns_per_task == {0: 13 * US, 1: 20 * US}


def test_side_ns_outside_bubbles():
    r = make_report()
    # L2 50-52 in B; L5 ∪ L6 120-125 in F; L7 170-172 in B.
    assert r.side_ns_outside_bubbles == 9 * US


def test_estimated_overhead_straddling_launches():
    r = make_report()
    # B of it0 starts at 50 while L2 runs to 52: 2. F of it1 starts at 120 while L6 runs to
    # 121 and L5 to 125: the action waits for the last, 5 (not 1 + 5). L7 started inside a
    # compute action, so it is no pause latency.
    assert r.estimated_overhead == pytest.approx(7 * US / (200 * US))


def test_estimated_overhead_clips_at_compute_end():
    # One launch covering the whole iteration: each compute action pays its full length.
    it = Iteration(
        0,
        0,
        50 * US,
        compute=[Compute(10 * US, 20 * US, "F"), Compute(30 * US, 40 * US, "B")],
        bubbles=[
            Bubble(0, 0, 0, 10 * US),
            Bubble(0, 1, 20 * US, 30 * US),
            Bubble(0, 2, 40 * US, 50 * US),
        ],
    )
    r = Report("cuda:0", "cuda", iterations=[it], launches=[SideLaunch(0, "T", 0, 0, 50 * US, 5)])
    assert r.estimated_overhead == pytest.approx(20 / 50)
    assert r.side_ns_outside_bubbles == 20 * US
    assert r.harvested_ns == 30 * US


def test_host_overhead_is_the_time_in_hooks():
    # On the host backend an item straddling a compute start runs on a SCHED_IDLE worker
    # beside training: the estimate is the training thread's own time in the hooks.
    r = make_report(backend="host")
    assert r.side_ns_outside_bubbles == 9 * US  # the launches are the same
    assert r.estimated_overhead == 0.0
    r.iterations[0].hook_ns = 3 * US
    r.iterations[1].hook_ns = 5 * US
    assert r.hook_ns == 8 * US
    assert r.estimated_overhead == pytest.approx(8 * US / (200 * US))
    back = Report.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back.hook_ns == 8 * US and back.totals()["hook_ns"] == 8 * US
    assert "time in hooks" in r.summary()


def test_launch_ending_exactly_at_compute_start_costs_nothing():
    it = Iteration(
        0, 0, 20 * US, compute=[Compute(10 * US, 20 * US, "F")], bubbles=[Bubble(0, 0, 0, 10 * US)]
    )
    r = Report("cuda:0", "cuda", iterations=[it], launches=[SideLaunch(0, "T", 0, 0, 10 * US, 1)])
    assert r.estimated_overhead == 0.0
    assert r.side_ns_outside_bubbles == 0
    assert r.harvested_ns == 10 * US


def test_items_overruns_and_task_names():
    r = make_report()
    assert r.items_per_task == {0: 6 + 7 + 3 + 1, 1: 10 + 8 + 2}
    assert r.overruns == 2
    assert r.task_names == {0: "Spin(a)", 1: "Train(b)"}


def test_per_slot():
    slots = {s["slot"]: s for s in make_report().per_slot}
    assert sorted(slots) == [0, 1, 2]
    assert slots[0]["count"] == 2
    assert slots[0]["mean_ns"] == pytest.approx(15 * US)
    assert (slots[0]["min_ns"], slots[0]["max_ns"]) == (10 * US, 20 * US)
    assert slots[0]["mean_free_memory"] == pytest.approx(2000)
    assert slots[1]["mean_ns"] == pytest.approx(10 * US)
    assert slots[1]["mean_free_memory"] == pytest.approx(500)  # it0's slot 1 has none
    assert slots[2]["mean_free_memory"] is None


def test_empty_report():
    r = Report("cpu", "host")
    assert (r.total_ns, r.compute_ns, r.bubble_ns, r.harvested_ns) == (0, 0, 0, 0)
    assert r.bubble_fraction == 0.0
    assert r.estimated_overhead == 0.0
    assert r.side_ns_outside_bubbles == 0
    assert r.items_per_task == {}
    assert r.per_slot == []
    assert "iterations" in r.summary()
    json.dumps(r.to_dict())


def test_unharvested_says_why_nothing_ran_in_the_bubbles():
    # make_report's bubbles (times in us): 10, 10, 10, 20, 10, 10 -> median 10, longest 20.
    assert make_report().unharvested == []  # side work ran: nothing to explain
    r = make_report()
    r.launches, r.tasks = [], []
    assert r.harvested_ns == 0
    assert r.unharvested == [
        "no side task was submitted",
        (
            "6 bubbles: median 10.000 us, longest 20.000 us (a side launch needs tens of"
            " microseconds to start after the gate opens)"
        ),
    ]
    r.tasks = [TaskSummary(0, "Spin(a)", "done", 5, 5), TaskSummary(1, "X", "cancelled", 0, 9)]
    assert (
        r.unharvested[0]
        == "every side task had ended before the recorded iterations (1 cancelled, 1 done)"
    )
    r.tasks.append(TaskSummary(2, "Y", "queued", 0, 9))
    assert r.unharvested[0].startswith("1 side task(s) still queued")
    r.launches = [SideLaunch(0, "Spin(a)", 0, 12 * US, 14 * US, 2)]  # inside compute F
    assert "1 side launch(es) recorded, none inside a bubble" in r.unharvested
    assert "nothing harvested:" in r.summary()
    assert "nothing harvested" not in make_report().summary()
    assert Report("cpu", "host").unharvested == []  # no bubbles


# ------------------------------------------------------------------------- text


def test_summary_mentions_key_numbers():
    r = make_report()
    s = r.summary()
    assert str(r) == s
    assert "cuda:0" in s and "backend cuda" in s and "rank 0" in s
    assert "35.0%" in s  # bubble fraction
    assert "200.000 us" in s  # total time
    assert "31.000 us" in s  # harvested
    assert "44.3% of bubble time" in s  # 31 / 70
    assert "3.500%" in s  # estimated overhead
    assert "Spin(a)" in s and "Train(b)" in s
    lines = s.splitlines()
    overruns = next(line for line in lines if "overruns" in line)
    assert overruns.split()[-1] == "2"
    spin = next(line for line in lines if "Spin(a)" in line)
    train = next(line for line in lines if "Train(b)" in line)
    assert "17" in spin and "20" in train
    # The key/value block is aligned: every value starts in the column after the longest
    # key ("side outside bubbles", 20 characters, indented 2, then 2 spaces).
    for line in lines[1:11]:
        assert line[22:24] == "  " and line[24] != " ", line


def test_repr_is_short():
    r = make_report()
    assert len(repr(r)) < 200
    assert "iterations=2" in repr(r)


# ------------------------------------------------------------------------- dicts


def test_to_dict_round_trip():
    r = make_report(rank=3)
    d = r.to_dict()
    assert Report.from_dict(d) == r
    via_json = Report.from_dict(json.loads(json.dumps(d)))
    assert via_json == r
    assert via_json.iterations[1].bubbles[0].side == {1: (12.5, 15 * US)}
    assert via_json.rank == 3
    assert via_json.estimated_overhead == r.estimated_overhead


def test_to_dict_totals_are_json():
    d = json.loads(json.dumps(make_report().to_dict()))
    t = d["totals"]
    assert t["total_ns"] == 200 * US
    assert t["bubble_fraction"] == pytest.approx(0.35)
    assert t["harvested_ns"] == 31 * US
    assert t["side_ns_outside_bubbles"] == 9 * US
    assert t["items_per_task"] == {"0": 17, "1": 20}
    assert t["overruns"] == 2
    assert t["estimated_overhead"] == pytest.approx(0.035)
    assert len(t["per_slot"]) == 3


def test_to_dict_survives_unserialisable_settings(tmp_path):
    r = make_report()
    r.settings = {"path": tmp_path, "nan": float("nan"), "nested": {1: {2, 3}}}
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    assert d["settings"]["path"] == str(tmp_path)
    assert d["settings"]["nan"] == "nan"


def test_from_dict_ignores_unknown_fields():
    d = make_report().to_dict()
    d["launches"][0]["stream"] = 7  # a field a later version might add
    assert Report.from_dict(d).launches[0].items == 6


# ------------------------------------------------------------------------- chrome trace


def _load(path):
    with open(path) as f:
        return json.load(f)


def _tracks(trace, pid):
    return {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid
    }


def test_chrome_trace_format(tmp_path):
    path = tmp_path / "trace.json"
    make_report(rank=2).to_chrome_trace(path)
    trace = _load(path)
    assert trace["displayTimeUnit"] == "ms"
    assert trace["metadata"]["device"] == "cuda:0"
    assert trace["metadata"]["totals"]["harvested_ns"] == 31 * US
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert spans
    for e in spans:
        for key in ("name", "ph", "ts", "dur", "pid", "tid"):
            assert key in e
        assert isinstance(e["ts"], float) and isinstance(e["dur"], float)
        assert e["dur"] >= 0
        assert e["pid"] == 2

    tracks = _tracks(trace, 2)
    assert set(tracks.values()) == {
        "iterations",
        "training compute",
        "bubbles",
        "side: Spin(a)",
        "side: Train(b)",
    }
    by_track = {name: [e for e in spans if e["tid"] == tid] for tid, name in tracks.items()}

    assert [e["name"] for e in by_track["iterations"]] == ["iteration 0", "iteration 1"]
    compute = by_track["training compute"]
    assert [e["name"] for e in compute] == ["F s0 mb0", "B s0 mb0", "F s0 mb1", "B s0 mb1"]
    assert (compute[0]["ts"], compute[0]["dur"]) == (10.0, 30.0)  # microseconds

    bubbles = by_track["bubbles"]
    assert len(bubbles) == 6
    assert {e["name"] for e in bubbles} == {"bubble 0", "bubble 1", "bubble 2"}
    first = bubbles[0]
    assert first["args"]["duration_us"] == 10.0
    assert first["args"]["free_memory"] == 1000
    assert first["args"]["side_items"] == {"0: Spin(a)": 6.0}

    spin = by_track["side: Spin(a)"]
    train = by_track["side: Train(b)"]
    assert len(spin) == 4 and len(train) == 3
    assert [e["args"]["items"] for e in spin] == [6, 7, 3, 1]
    assert [e["args"]["phase"] for e in train] == [0, 1, 1]
    assert (spin[1]["ts"], spin[1]["dur"]) == (45.0, 7.0)

    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"rank 2"}


def test_chrome_trace_without_rank_uses_pid_0(tmp_path):
    path = tmp_path / "trace.json"
    make_report(rank=None).to_chrome_trace(path)
    assert {e["pid"] for e in _load(path)["traceEvents"]} == {0}


@pytest.mark.parametrize("path", [True, 1, 3.5, None])
def test_a_trace_path_must_be_a_file_name(path, tmp_path):
    # open() takes an int (a bool too) for a file descriptor: True wrote the trace to
    # stdout and closed it.
    with pytest.raises(TypeError, match="path must be a str or os.PathLike file name"):
        make_report(rank=0).to_chrome_trace(path)
    with pytest.raises(TypeError, match="path must be a str or os.PathLike file name"):
        merge_chrome_traces([make_report(rank=0)], path)
    with pytest.raises(TypeError, match="path must be a str or os.PathLike file name"):
        fr.merge_with_profiler_trace(make_report(rank=0), tmp_path / "no.json", path)


def test_merge_chrome_traces(tmp_path):
    path = tmp_path / "merged.json"
    reports = [make_report(rank=0), make_report(rank=1)]
    merge_chrome_traces(reports, path)
    trace = _load(path)
    events = trace["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    for pid in (0, 1):
        assert "training compute" in _tracks(trace, pid).values()
        assert sum(1 for e in events if e["ph"] == "X" and e["pid"] == pid) == 2 + 4 + 6 + 7
    assert [r["pid"] for r in trace["metadata"]["ranks"]] == [0, 1]

    # The deprecated static method is the same writer; rankless reports get distinct pids.
    with pytest.warns(DeprecationWarning, match="fr.merge_chrome_traces"):
        Report.merge_chrome_traces([make_report(rank=None), make_report(rank=0)], path)
    assert {e["pid"] for e in _load(path)["traceEvents"]} == {0, 1}


# ------------------------------------------------------------------------- plot


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    r = make_report()
    r.plot(tmp_path / "last.png")
    assert _is_png(tmp_path / "last.png")
    r.plot(tmp_path / "one.png", iterations=[1])
    assert _is_png(tmp_path / "one.png")
    Report("cpu", "host").plot(tmp_path / "empty.png")
    assert _is_png(tmp_path / "empty.png")


def test_plot_rejects_unknown_iteration(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(ValueError, match="no recorded iteration"):
        make_report().plot(tmp_path / "x.png", iterations=[7])


def test_plot_without_matplotlib_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        make_report().plot(tmp_path / "x.png")


def _demo_like_report() -> Report:
    """Four 100 us iterations 50 us apart (steps in between were not recorded), an endless
    Spin and two Saxpy tasks."""
    iterations = []
    for i in range(4):
        t0 = i * 150 * US
        iterations.append(
            Iteration(
                index=i,
                start_ns=t0,
                end_ns=t0 + 100 * US,
                compute=[Compute(t0 + 40 * US, t0 + 60 * US, f"F s0 mb{i}")],
                bubbles=[
                    Bubble(i, 0, t0, t0 + 40 * US),
                    Bubble(i, 1, t0 + 60 * US, t0 + 100 * US),
                ],
            )
        )
    spin = "Spin(items=1099511627776, ns_per_item=50000, phases=1)"
    launches = [SideLaunch(1, spin, 0, it.start_ns, it.start_ns + 40 * US, 8) for it in iterations]
    launches += [
        SideLaunch(2, "Saxpy(a=2.0, shape=(8,))", 0, 60 * US, 90 * US, 1),
        SideLaunch(3, "Saxpy(a=3.0, shape=(8,))", 0, 210 * US, 240 * US, 1),
    ]
    return Report("cpu", "host", rank=1, iterations=iterations, launches=launches)


def _texts(fig):
    return [t.get_text() for t in fig.axes[0].texts]


def test_timeline_title_lanes_and_gaps():
    pytest.importorskip("matplotlib")
    r = _demo_like_report()
    fig = r.timeline(gap_label="step without side work")
    ax = fig.axes[0]
    title = ax.get_title()
    assert "4 iterations recorded" in title
    assert "shown: iterations 1-3 (3 of 4)" in title
    # Short lane names: no argument lists cut off mid-number; tasks of one class told apart.
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    assert lanes == ["compute", "bubbles", "side: Spin", "side: Saxpy #2", "side: Saxpy #3"]
    # The two gaps between the shown iterations are named.
    assert sum(t.replace("\n", " ") == "step without side work" for t in _texts(fig)) == 2
    assert not any("side work" in t for t in _texts(r.timeline(gap_label=None)))
    # A chosen, non-contiguous set of iterations is listed.
    assert "shown: iterations 0, 2 (2 of 4)" in r.timeline(iterations=[0, 2]).axes[0].get_title()
    assert "shown: iteration 3 (1 of 4)" in r.timeline(iterations=[3]).axes[0].get_title()


def _launch_dict(**over):
    """A SideLaunch as to_dict writes it, with `over` changed."""
    return {"task_id": 1, "phase": 0, "start_ns": 0, "end_ns": 5, "items": 1, **over}


@pytest.mark.parametrize(
    "d, exc, match",
    [
        ([], TypeError, "d must be the dict Report.to_dict wrote, got list"),
        ({}, ValueError, "not a report Report.to_dict wrote: KeyError: 'device'"),
        ({"device": "cpu", "backend": "host", "format": 999}, ValueError, "of format 999"),
        (
            {"device": "cpu", "backend": "host", "iterations": [{"index": 0, "start_ns": "5"}]},
            ValueError,
            "Iteration.start_ns must be an int, got '5'",
        ),
        (
            {"device": "cpu", "backend": "host", "launches": [_launch_dict(end_ns=float("nan"))]},
            ValueError,
            "SideLaunch.end_ns must be an int, got nan",
        ),
        (
            {"device": "cpu", "backend": "host", "launches": [_launch_dict(start_ns=9, end_ns=5)]},
            ValueError,
            "SideLaunch ends before it starts: start_ns 9, end_ns 5",
        ),
    ],
)
def test_from_dict_refuses_what_to_dict_never_wrote(d, exc, match):
    # Such dicts loaded before and failed later, far from the bad value (a total, a trace).
    with pytest.raises(exc, match=match):
        Report.from_dict(d)


def test_placement_table_orders_rank_and_client_tasks_together():
    # An outside client's ids ("box prefix:number") beside the ranks' ("rank:number"):
    # sorting them used to compare a str with an int.
    def entry(label):
        return {"local_id": 1, "label": label, "state": "done", "items": 10}

    hosted = {
        "c3dca:10": entry("late client"),
        "1:2": entry("rank 1 second"),
        "c3dca:9": entry("early client"),
        "0:11": entry("rank 0 eleventh"),
        "0:2": entry("rank 0 second"),
        "other": entry("odd id"),
        "cab:²": entry("superscript"),  # a client's own choice: int() refuses "²"
    }
    report = fr.Report(device="cpu", backend="host", rank=0, placement={"hosted": hosted})
    table = fr.placement_table([report], legend=False)
    order = [e["label"] for e in hosted.values()]
    seen = sorted(order, key=table.index)
    assert seen == [
        "rank 0 second",
        "rank 0 eleventh",
        "rank 1 second",
        "early client",
        "late client",
        "superscript",  # the rest by their text
        "odd id",
    ]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: fr.placement_table(None), "got None .gather_reports.. returns None"),
        (lambda: fr.placement_table("rank0.json"), "reports must be a list of freeride Reports"),
        (
            lambda: fr.placement_table({"r": 1}),
            "reports must be a list of freeride Reports, got dict",
        ),
        (lambda: fr.stage_table([Report("cpu", "host"), 1]), r"reports\[1\] must be a freeride"),
        (lambda: fr.gather_reports(None), "report must be a freeride Report, got NoneType"),
        (lambda: fr.merge_chrome_traces("r.json", "out.json"), "reports must be a list"),
        (lambda: fr.merge_chrome_traces([None], "out.json"), r"reports\[0\] must be a freeride"),
        (
            lambda: fr.merge_with_profiler_trace("r.json", "p.json", "out.json"),
            "reports must be a freeride Report or a list of them, got str",
        ),
    ],
)
def test_what_is_not_a_report_is_refused_by_name(call, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match=match):
        call()
    assert list(tmp_path.iterdir()) == []  # nothing written
