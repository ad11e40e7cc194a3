"""The freeride command as a user runs it: in a subprocess, reading its exit code, its
error line and what the demo writes."""

import io
import json
import subprocess
import sys

import pytest

import freeride as fr
from freeride.demo import DemoConfig, Progress, describe_work

HAS_GPU = bool(fr.backend_info()["cuda"])


def freeride(*args, cwd=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "freeride", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )


def error_line(proc):
    """The one line argparse prints after the usage."""
    lines = proc.stderr.strip().splitlines()
    assert lines, proc
    return lines[-1]


@pytest.mark.parametrize(
    "args, option, expected",
    [
        (["demo", "--stages", "1"], "--stages", "must be in [2, 64], got 1"),
        (["demo", "--stages", "0"], "--stages", "must be in [2, 64], got 0"),
        (["demo", "--stages", "-2"], "--stages", "must be in [2, 64], got -2"),
        (["demo", "--stages", "two"], "--stages", "must be an integer in [2, 64]"),
        (["demo", "--microbatches", "0"], "--microbatches", "must be >= 1, got 0"),
        (["demo", "--microbatches", "3"], "--microbatches", "must be >= 4 for 1f1b on 4 stages"),
        (
            ["demo", "--schedule", "dualpipev", "--stages", "2", "--microbatches", "3"],
            "--microbatches",
            "must be >= 4 for dualpipev on 2 stages",
        ),
        (
            ["demo", "--schedule", "interleaved", "--microbatches", "9"],
            "--microbatches",
            "must be a multiple of 2 for interleaved",
        ),
        (["demo", "--steps", "0"], "--steps", "must be >= 2, got 0"),
        (["demo", "--steps", "1"], "--steps", "must be >= 2, got 1"),
        (["demo", "--item-us", "-5"], "--item-us", "must be in [1, 1000000], got -5"),
        (["demo", "--item-us", "0"], "--item-us", "must be in [1, 1000000], got 0"),
        (["demo", "--device", "gpu"], "--device", "invalid choice: 'gpu'"),
        (["demo", "--device", "cuda:3"], "--device", "invalid choice: 'cuda:3'"),
        (["demo", "--device", "banana"], "--device", "invalid choice: 'banana'"),
        (["bench", "items", "--plot", "x.png"], "--plot", "only preempt draws a plot"),
    ],
)
def test_bad_arguments_are_one_line_errors(args, option, expected, tmp_path):
    proc = freeride(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    line = error_line(proc)
    assert line.startswith(f"freeride {args[0]}: error: argument {option}"), line
    assert expected in line, line
    assert not list(tmp_path.iterdir())  # nothing ran


@pytest.mark.skipif(HAS_GPU, reason="needs a machine where CUDA is unusable")
def test_cuda_device_without_a_gpu_says_so(tmp_path):
    proc = freeride("demo", "--device", "cuda", cwd=tmp_path)
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    line = error_line(proc)
    assert line.startswith("freeride demo: error: argument --device: cuda was asked for"), line
    assert fr.backend_info()["reason"] in line
    assert "freeride demo:" not in proc.stdout  # stopped before anything was spawned


@pytest.mark.skipif(HAS_GPU, reason="needs a machine where CUDA is unusable")
def test_bench_gpu_mode_without_a_gpu_says_so(tmp_path):
    proc = freeride("bench", "items", "--mode", "gpu", cwd=tmp_path)
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    line = error_line(proc)
    assert line.startswith("freeride bench: error: argument --mode: gpu needs a usable CUDA GPU")
    assert fr.backend_info()["reason"] in line


def test_unwritable_outputs_fail_before_the_run(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for outdir, expected in ((afile, "is a file, not a folder"), (afile / "sub", "cannot write")):
        proc = freeride("demo", "--outdir", str(outdir), cwd=tmp_path)
        assert proc.returncode == 2, proc
        line = error_line(proc)
        assert line.startswith("freeride demo: error: argument --outdir"), line
        assert expected in line, line
        assert "freeride demo:" not in proc.stdout
    proc = freeride("bench", "items", "--out", str(tmp_path / "no" / "r.json"), cwd=tmp_path)
    assert proc.returncode == 2
    assert error_line(proc).startswith("freeride bench: error: argument --out")


def test_help_shows_defaults_and_every_command():
    top = freeride("--help")
    assert top.returncode == 0
    assert "`" not in top.stdout  # plain text, not RST
    for command in ("demo", "bench", "info"):
        assert f"freeride {command}" in top.stdout
    demo = " ".join(freeride("demo", "--help").stdout.split())  # help text is wrapped
    assert "(default: 4)" in demo and "(default: 1f1b)" in demo and "(default: auto)" in demo
    assert "(default: auto)" in " ".join(freeride("bench", "--help").stdout.split())


def test_info_prints_backend_info():
    proc = freeride("info")
    assert proc.returncode == 0
    info = json.loads(proc.stdout)
    assert info["cuda"] == HAS_GPU and "default_backend" in info


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_a_line_per_step_unless_on_a_terminal():
    log = io.StringIO()
    progress = Progress(3, log)
    for i in range(3):
        progress.step(i + 1, harvesting=i % 2 == 0)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert len(lines) == 3
    assert "step 1/3 (harvesting)" in lines[0] and "step 2/3 (no side work)" in lines[1]
    tty = _Tty()
    progress = Progress(2, tty)
    progress.step(1, True)
    progress.step(2, False)
    assert tty.getvalue().count("\r") == 2 and tty.getvalue().endswith("\n")


def test_summary_without_a_side_task_says_so():
    assert describe_work(DemoConfig(task="none"), 0) == "none (--task none)"
    assert describe_work(DemoConfig(task="spin", item_us=20), 1234) == "1,234 Spin items of 20 us"


def test_demo_placement_sends_tasks_to_the_ranks(tmp_path):
    """--placement: tasks submitted once, on rank 0, run on the ranks the queue chose, and
    the table shows each rank's bubble time beside the tasks it ran."""
    pytest.importorskip("torch")
    args = ["--stages", "2", "--microbatches", "4", "--steps", "10", "--placement"]
    proc = freeride("demo", *args, "--device", "cpu", "--outdir", str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "6 Spin tasks of 400 x 50 us items, submitted on rank 0 to fr.JobQueue" in out
    table = out[out.index("job-wide placement") :]
    assert "6 placement decisions" in table
    rows = [line.split() for line in table.splitlines() if " Spin " in f" {line} "]
    assert len(rows) == 6, table
    # Every task placed, none lost: each ended done or cancelled (the run is over).
    states = [row[-3] for row in rows]
    assert set(states) <= {"done", "cancelled"}, table
    assert sum(int(row[-2].replace(",", "")) for row in rows) > 0, table
    assert "ms of bubbles per iteration" in table  # placed by measured bubbles


def test_demo_records_only_the_harvesting_steps(tmp_path):
    """A small real run: no carriage returns in a piped log, warm-up steps neither recorded
    nor counted, only the last stage's loss recorded as compute, and both files written."""
    pytest.importorskip("torch")
    out = tmp_path / "out"
    args = ["--stages", "2", "--microbatches", "2", "--steps", "4", "--item-us", "20"]
    proc = freeride("demo", *args, "--device", "cpu", "--outdir", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\r" not in proc.stderr and "\r" not in proc.stdout
    assert [line.split("(")[0].strip() for line in proc.stderr.splitlines() if "step" in line][
        :4
    ] == [f"step {i}/4" for i in range(1, 5)]
    assert "Spin, 20 us items" in proc.stdout
    assert "2 harvesting steps per rank, warm-up excluded" in proc.stdout
    trace = json.loads((out / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    for rank in (0, 1):
        mine = [e for e in spans if e["pid"] == rank]
        assert sum(e["cat"] == "iteration" for e in mine) == 2  # steps 0 and 2 of 4
        losses = [e for e in mine if e["cat"] == "compute" and e["name"].startswith("loss")]
        assert bool(losses) == (rank == 1), losses[:3]  # stage 1 is the last
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
