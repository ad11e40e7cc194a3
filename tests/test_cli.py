"""The freeride command as a user runs it: in a subprocess, reading its exit code, its
error line and what the demo writes."""

import io
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

import freeride as fr
from freeride.cli._stats import paired_overhead
from freeride.cli.demo import DemoConfig, Progress, describe_work, harvesting_text
from freeride.cli.info_text import summary

HAS_GPU = bool(fr.backend_info()["cuda"])


# `freeride submit` up to its options; q.json does not exist (checked after the options).
_SUBMIT = ["submit", "--queue", "q.json", "freeride.tasks:Spin"]


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
        (["demo", "--launch", "torchrun"], "--launch", "invalid choice: 'torchrun'"),
        (["bench", "items", "--plot", "x.png"], "--plot", "only preempt draws a plot"),
        (["bench", "items", "--minutes", "1"], "--minutes", "only soak runs for a set time"),
        (["bench", "items", "--attack"], "--attack", "only soak runs with an attacker"),
        (["bench", "items", "--iterations", "5"], "--iterations", "only pipeline takes it"),
        (["bench", "pipeline", "--iterations", "0"], "--iterations", "must be in [1, 1000]"),
        (["bench", "soak", "--minutes", "0"], "--minutes", "must be > 0 and <= 1440, got 0"),
        (["bench", "soak", "--minutes", "-1"], "--minutes", "must be > 0 and <= 1440, got -1"),
        (["bench", "soak", "--minutes", "ten"], "--minutes", "must be a number, got 'ten'"),
        (["bench", "soak", "--mode", "gpu"], "--mode", "soak runs on the host backend only"),
        (
            _SUBMIT + ["--args", "[1,"],
            "--args",
            "not valid JSON (Expecting value at line 1 column 4)",
        ),
        (_SUBMIT + ["--args", '{"a": 1}'], "--args", "must be a JSON list, got dict"),
        (_SUBMIT + ["--args", "@no-args.json"], "--args", "cannot read the file 'no-args.json'"),
        (_SUBMIT + ["--kwargs", "[1]"], "--kwargs", "must be a JSON object, got list"),
        (_SUBMIT + ["--kwargs", "{items: 3}"], "--kwargs", "not valid JSON (Expecting property"),
        (_SUBMIT + ["--memory", "lots"], "--memory", "cannot parse 'lots'"),
        (_SUBMIT + ["--priority", "high"], "--priority", "must be an integer"),
        (_SUBMIT + ["--timeout", "5"], "--timeout", "only with --wait"),
        (_SUBMIT + ["--wait", "--timeout", "0"], "--timeout", "must be > 0"),
        (
            ["submit", "--queue", "q.json", "freeride.tasks.Spin"],
            "FACTORY",
            "must be 'module:qualname', e.g. freeride.tasks:Spin, got 'freeride.tasks.Spin'",
        ),
        (_SUBMIT, "--queue", "no such file: 'q.json'"),
        (["status", "--queue", "q.json"], "--queue", "no such file: 'q.json'"),
        (["status", "--queue", "q.json", "--timeout", "-1"], "--timeout", "must be > 0"),
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


def test_bench_hooks_prints_its_table_and_writes_json(tmp_path):
    out = tmp_path / "hooks.json"
    proc = freeride("bench", "hooks", "--mode", "cpu", "--quick", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["benchmark"] == "hooks" and result["mode"] == "cpu"
    assert [row["hooks"] for row in result["rows"]] == ["h.compute()", "attach()"]
    header = proc.stdout.splitlines()[1].split()
    assert header == ["backend", "hooks", "part", "pairs", "p50_ns", "p99_ns", "mean_ns"]


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
    for command in ("demo", "bench", "submit", "status", "info"):
        assert f"freeride {command}" in top.stdout
    demo = " ".join(freeride("demo", "--help").stdout.split())  # help text is wrapped
    assert "(default: 4)" in demo and "(default: 1f1b)" in demo and "(default: auto)" in demo
    assert "(default: auto)" in " ".join(freeride("bench", "--help").stdout.split())


def test_info_prints_a_summary_and_backend_info_as_json():
    """Issue 37: `freeride info` is readable by default (where side tasks run, the build,
    CUDA, the devices) and JSON with --json."""
    proc = freeride("info", "--json")
    assert proc.returncode == 0
    info = json.loads(proc.stdout)
    assert info["cuda"] == HAS_GPU and "default_backend" in info
    proc = freeride("info")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"freeride {info['version']}: side tasks run on ")
    rows = {line.split()[0] for line in lines[1:] if line.startswith("  ")}
    assert {"build", "CUDA"} <= rows
    assert ("devices" in rows) != bool(info["devices"])
    if info["cuda_built"]:
        major, minor = info["cuda_build"]["toolkit"]
        assert f"nvcc {major}.{minor}" in proc.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(proc.stdout)


def test_info_summary_of_a_gpu_machine_and_of_one_without_cuda():
    """The summary's lines from backend_info() as a GPU machine and a host-only build
    give it (no GPU is needed to check the wording)."""
    gpu = {
        "version": "9.9",
        "default_backend": "cuda",
        "cuda_built": True,
        "cuda_build": {"toolkit": (13, 0), "architectures": "80-real,90", "ptx_isa": "9.0"},
        "cuda": True,
        "runtime_version": 13000,
        "driver_version": 13000,
        "reason": "",
        "cuda_error": "",
        "devices": [
            {
                "index": 0,
                "name": "NVIDIA H200",
                "sm_count": 132,
                "compute_capability": (9, 0),
                "stream_mem_ops": True,
                "gate_write": "batch",
                "green_contexts": True,
            }
        ],
        "module_loading": "lazy",
        "reserve_mechanism": "green-context (120 of 132 SMs)",
        "reserve_fallback": None,
        "gpu_unused": None,
    }
    text = summary(gpu)
    assert text.splitlines()[0] == 'freeride 9.9: side tasks run on CUDA with device="auto"'
    assert "nvcc 13.0, architectures 80-real 90, PTX ISA 9.0" in text
    assert "runtime 13.0, driver 13.0" in text
    assert "device 0  NVIDIA H200: compute capability 9.0, 132 SMs, gate writes batch" in text
    assert "reserve   green-context (120 of 132 SMs)" in text
    assert "loading   lazy" in text
    host = dict(
        gpu,
        default_backend="host",
        cuda_built=False,
        cuda_build=None,
        cuda=False,
        runtime_version=0,
        driver_version=0,
        reason="built without CUDA",
        devices=[],
        module_loading=None,
        gpu_unused="this machine has a GPU: rebuild with nvcc",
    )
    text = summary(host)
    assert "the host backend (CPU threads)" in text.splitlines()[0]
    assert "host backend only (built without CUDA" in text
    assert "driver none: unusable, built without CUDA" in text
    assert "devices  none" in text or "devices   none" in text
    assert "reserve" not in text and "loading" not in text
    assert text.splitlines()[-1] == "GPU unused: this machine has a GPU: rebuild with nvcc"


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


def test_harvesting_line_gives_the_interval_and_says_when_it_holds_zero():
    """Issue 21 item 4: a paired median of -16% from a noisy 2-core run read as a bug;
    the line gives the bootstrap interval (as `bench ranks` does) and says when the run
    cannot tell the cost from none."""
    # Noise: pairs that go both ways, a median below 0 and an interval that holds 0.
    noisy = paired_overhead([0.9, 1.2, 0.8, 1.1, 0.85, 1.05], [1.0] * 6)
    assert noisy.low <= 0 <= noisy.high and noisy.median < 0
    line = harvesting_text(0.0697, noisy)
    assert line.startswith("69.7 ms (-")
    assert "median over 6 step pairs, 95% interval " in line
    assert line.endswith(": within noise on this machine)")
    # A clear cost: every pair slower by 4 to 6%; the interval excludes 0.
    clear = paired_overhead([1.04, 1.05, 1.06, 1.05, 1.04, 1.06], [1.0] * 6)
    assert 0 < clear.low <= clear.median <= clear.high
    line = harvesting_text(0.105, clear)
    assert line == (
        f"105.0 ms ({clear.median:+.1%}, median over 6 step pairs, 95% interval "
        f"{clear.low:+.1%} to {clear.high:+.1%})"
    )
    assert "noise" not in line
    # One pair has no interval; the longer list is cut to the shorter.
    one = paired_overhead([1.1, 1.2], [1.0])
    assert one.pairs == 1
    assert harvesting_text(0.011, one) == (
        "11.0 ms (+10.0%, median over 1 step pair; too few for an interval)"
    )


def test_bench_ranks_and_the_demo_share_one_paired_overhead():
    from freeride.cli import demo
    from freeride.cli.bench import ranks

    assert ranks.paired_overhead is demo.paired_overhead is paired_overhead


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
    assert "each rank in its own session (as torchrun starts them)" in proc.stdout
    side = next(line for line in proc.stdout.splitlines() if "host side threads" in line)
    assert side.split()[-1] in ("sched-idle", "idle-cgroup", "backoff"), side
    assert "2 harvesting steps per rank, warm-up excluded" in proc.stdout
    harvesting = next(line for line in proc.stdout.splitlines() if "iteration, harvesting" in line)
    assert "median over 2 step pairs, 95% interval" in harvesting, harvesting
    trace = json.loads((out / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    for rank in (0, 1):
        mine = [e for e in spans if e["pid"] == rank]
        assert sum(e["cat"] == "iteration" for e in mine) == 2  # steps 0 and 2 of 4
        losses = [e for e in mine if e["cat"] == "compute" and e["name"].startswith("loss")]
        assert bool(losses) == (rank == 1), losses[:3]  # stage 1 is the last
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _note_session(rank, folder):
    with open(os.path.join(folder, f"{rank}.json"), "w") as f:
        json.dump({"sid": os.getsid(0), "leader": os.getsid(0) == os.getpid()}, f)


@pytest.mark.parametrize("sessions", [True, False])
def test_ranks_start_in_their_own_sessions_as_under_torchrun(sessions, tmp_path):
    """The demo's and bench ranks' default launch, each rank leading a session of its
    own as torchrun's workers do (where autogroup is on, a scheduling group of its own),
    and the launch with every rank in the launcher's session."""
    pytest.importorskip("torch")
    from freeride.cli.spawn import run_ranks

    run_ranks(_note_session, 2, str(tmp_path), timeout=120, sessions=sessions)
    seen = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    if sessions:
        assert all(s["leader"] for s in seen), seen
        assert seen[0]["sid"] != seen[1]["sid"]
    else:
        assert [s["sid"] for s in seen] == [os.getsid(0)] * 2


def _leave_work_for_the_exit(rank, folder):
    """A rank that returns with work a normal exit would still do: a non-daemon thread
    that finishes later, an atexit handler, output not yet flushed."""
    import atexit
    import threading
    import time

    def late():
        time.sleep(0.2)
        with open(os.path.join(folder, f"thread{rank}"), "w") as f:
            f.write("joined")

    threading.Thread(target=late).start()
    atexit.register(lambda: open(os.path.join(folder, f"atexit{rank}"), "w").close())
    # A pool never shut down: its idle worker waits for work until threading's exit
    # callback stops it (a plain join of the non-daemon threads would wait for good).
    from concurrent.futures import ThreadPoolExecutor

    ThreadPoolExecutor(1).submit(int).result()
    print(f"rank {rank} unflushed", end="")


def test_a_rank_that_returns_exits_as_a_normal_exit_would(tmp_path, capfd):
    """run_ranks ends a rank that returned with os._exit (no interpreter teardown, where a
    gloo worker thread taking the GIL aborted the process), after what a normal exit does
    first: threading's exit callbacks (an idle pool's workers stopped) and the other
    non-daemon threads joined, the atexit handlers run, the output flushed; and the exit
    is a success."""
    pytest.importorskip("torch")
    from freeride.cli.spawn import run_ranks

    run_ranks(_leave_work_for_the_exit, 2, str(tmp_path), timeout=120)
    for rank in range(2):
        assert (tmp_path / f"thread{rank}").read_text() == "joined"
        assert (tmp_path / f"atexit{rank}").exists()
    out = capfd.readouterr().out
    assert "rank 0 unflushed" in out and "rank 1 unflushed" in out


def _write(path, text, mode):
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


_QUEUE_FILE = json.dumps({"address": "localhost:1", "secret": "ab" * 32, "server_key": "k" * 40})


@pytest.mark.parametrize("command", ["submit", "status"])
def test_secret_file_problems_are_argument_errors(command, tmp_path):
    """A --queue file that is missing, not a queue's, or open to other users stops the
    command before it connects (the secret in it lets the holder run code as the job)."""
    cases = [
        (str(tmp_path / "missing.json"), "no such file"),
        (_write(tmp_path / "group.json", _QUEUE_FILE, 0o640), "has mode 0640"),
        (_write(tmp_path / "others.json", _QUEUE_FILE, 0o604), "has mode 0604"),
        (_write(tmp_path / "gw.json", _QUEUE_FILE, 0o620), "has mode 0620"),
        (_write(tmp_path / "text.json", "address=x", 0o600), "cannot be read as the queue's JSON"),
        (
            _write(tmp_path / "nosecret.json", '{"address": "x:1"}', 0o600),
            "lacks 'address', 'secret' and",
        ),
    ]
    for path, expected in cases:
        args = ["--queue", path] + (["freeride.tasks:Spin"] if command == "submit" else [])
        proc = freeride(command, *args, cwd=tmp_path)
        assert proc.returncode == 2, proc
        assert "Traceback" not in proc.stderr
        line = error_line(proc)
        assert line.startswith(f"freeride {command}: error: argument --queue: "), line
        assert expected in line, line
        assert not proc.stdout
    args = ["--queue", str(tmp_path / "group.json")] + (["x:y"] if command == "submit" else [])
    line = error_line(freeride(command, *args))
    assert "refusing it" in line and "chmod 600" in line, line


# A 1-rank gloo job with a job queue that writes its secret file, until `stop` appears.
_JOB = textwrap.dedent(
    """
    import os, sys, time
    import torch.distributed as dist
    import freeride as fr

    folder = sys.argv[1]
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
    with fr.Harvester("cpu", workers=1) as h:
        q = fr.JobQueue(h, secret_file=os.path.join(folder, "queue.json"))
        while not os.path.exists(os.path.join(folder, "stop")):
            time.sleep(0.02)
        stats = q.stats()
        q.close()
    dist.destroy_process_group()
    print("stats", stats["dropped"], stats["malformed"], len(stats["lost_ranks"]), flush=True)
    """
)


def test_submit_and_status_against_a_running_job(tmp_path):
    """`freeride submit` and `freeride status` from outside a running job, through the
    secret file it wrote: a task that finishes, one that fails, one still running, a
    wait that times out, and a wrong secret refused."""
    pytest.importorskip("torch")
    queue = tmp_path / "queue.json"
    job = subprocess.Popen(
        [sys.executable, "-c", _JOB, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not queue.exists():
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "the job wrote no secret file"
            time.sleep(0.05)
        assert queue.stat().st_mode & 0o777 == 0o600
        q = ["--queue", str(queue)]

        done = freeride(
            "submit",
            *q,
            "freeride.tasks:ItemCounter",
            "--kwargs",
            '{"items": 50}',
            "--name",
            "count",
            "--wait",
            "--timeout",
            "60",
        )
        assert done.returncode == 0, done
        task_id, state, result = done.stdout.splitlines()[:3]
        assert state == "done (rank 0, 50/50 items)", done.stdout
        assert result.startswith("result: ItemCounts(counts=array([[1, 1,"), done.stdout

        failed = freeride("submit", *q, "nosuch.module:Task", "--wait", "--timeout", "60")
        assert failed.returncode == 1, failed
        assert failed.stdout.splitlines()[1].startswith("failed: "), failed.stdout
        assert "ModuleNotFoundError" in failed.stdout

        endless = '{"items": 1000000000, "ns_per_item": 1000}'
        running = freeride(
            "submit",
            *q,
            "freeride.tasks:Spin",
            "--kwargs",
            endless,
            "--name",
            "endless",
            "--priority",
            "-3",
        )
        assert running.returncode == 0, running
        [running_id] = running.stdout.split()
        late = freeride(
            "submit", *q, "freeride.tasks:Spin", "--kwargs", endless, "--wait", "--timeout", "0.5"
        )
        assert late.returncode == 124, late
        assert late.stdout.splitlines()[1].endswith("after 0.5 s (the task stays in the queue)")

        listed = freeride("status", *q, "--json")
        assert listed.returncode == 0, listed
        tasks = {t["id"]: t for t in json.loads(listed.stdout)}
        assert tasks[task_id]["state"] == "done" and tasks[task_id]["label"] == "count"
        assert tasks[task_id]["items_done"] == tasks[task_id]["items_total"] == 50
        assert tasks[failed.stdout.split()[0]]["state"] == "failed"
        assert tasks[running_id]["state"] in ("queued", "running", "paused")
        assert tasks[running_id]["priority"] == -3 and tasks[running_id]["label"] == "endless"
        for t in tasks.values():
            assert set(t) >= {
                "id",
                "label",
                "state",
                "rank",
                "items_done",
                "items_total",
                "priority",
                "origin",
            }
        table = freeride("status", *q)
        assert table.returncode == 0, table
        header, *rows = table.stdout.splitlines()
        assert header.split() == ["id", "label", "state", "rank", "items", "priority", "origin"]
        assert len(rows) == len(tasks)
        assert any(row.split()[:3] == [task_id, "count", "done"] for row in rows), table.stdout

        wrong = json.loads(queue.read_text())
        wrong["secret"] = "0" * 64
        wrong_file = _write(tmp_path / "wrong.json", json.dumps(wrong), 0o600)
        for command in (["status"], ["submit", "freeride.tasks:Spin"]):
            refused = freeride(command[0], "--queue", wrong_file, *command[1:])
            assert refused.returncode == 2, refused
            assert "Traceback" not in refused.stderr
            assert error_line(refused).startswith(f"freeride {command[0]}: refused: "), refused
            assert not refused.stdout
    finally:
        (tmp_path / "stop").touch()
        try:
            out, err = job.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            job.kill()
            out, err = job.communicate()
    assert job.returncode == 0, err[-3000:]
    # Nothing reached the job unverified: the wrong secret was turned away before sending.
    assert out.split() == ["stats", "0", "0", "0"], out
