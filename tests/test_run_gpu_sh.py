"""benchmarks/run_gpu.sh against the tree, without a GPU: every test selection it makes
(a file, `-m`, `-k`) collects at least one test, and every probe and file it names
exists. A GPU machine is lent for minutes a session: a test renamed or a probe moved must
fail here, not spend a device call running nothing ("no tests ran" is exit 5, which the
script reports like any failure, after the call)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "run_gpu.sh"

# Collects each selection in one interpreter (torch imported once) and prints how many
# tests each selects, as JSON.
COLLECT = """
import json, sys
import pytest

class Count:
    def __init__(self):
        self.n = 0
    def pytest_collection_finish(self, session):
        self.n = len(session.items)

counts = []
for args in json.loads(sys.argv[1]):
    count = Count()
    pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *args], plugins=[count])
    counts.append(count.n)
print("COUNTS " + json.dumps(counts))
"""


def _commands() -> list[list[str]]:
    """run_gpu.sh's command lines, continuation lines joined, comments left out, split
    as the shell would (variables stay as written)."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [shlex.split(line) for line in lines if line and not line.startswith("#")]


def _selections() -> list[list[str]]:
    """Each pytest run the script makes of a named test file: the file and its -m and -k
    arguments (what decides which tests run)."""
    found = []
    for words in _commands():
        if words[:1] == ["pytest_file"]:
            rest = words[3:]  # pytest_file DEADLINE LIMIT FILE [args]
        elif "pytest" in words and words[0] == "budgeted":
            rest = words[words.index("pytest") + 1 :]
        else:
            continue
        files = [w for w in rest if w.endswith(".py")]
        if not files or "$" in files[0]:
            continue  # the tests step's loop over every file, and the helper's own body
        args = [files[0]]
        for flag in ("-m", "-k"):
            if flag in rest:
                args += [flag, rest[rest.index(flag) + 1]]
        found.append(args)
    return found


def _probes() -> list[str]:
    """The scripts the script's `probe` calls run (benchmarks/probes/SCRIPT)."""
    found = []
    for words in _commands():
        if words[:1] != ["probe"] or len(words) < 5:
            continue
        rest = [w for w in words[4:] if "=" not in w and not w.startswith("${vars")]
        found.append(rest[0])
    return found


def test_the_script_names_what_it_runs():
    """The parse finds the runs it should: the qualify list's tests and probes (a change
    of the helpers' shape must not leave the checks below with nothing to check)."""
    selections = _selections()
    assert ["tests/test_launch_at_open.py", "-m", "gpu"] in selections
    assert ["tests/test_profiling.py", "-m", "gpu", "-k", "clock_origin"] in selections
    assert ["tests/test_slice_gpu.py", "-m", "gpu", "-k", "g1"] in selections
    assert len(selections) >= 20
    probes = _probes()
    assert {"probe_pause.py", "probe_occupancy_carveout.py", "probe_admission.py"} <= set(probes)


def test_every_probe_and_file_it_names_exists():
    for probe in _probes():
        assert (ROOT / "benchmarks" / "probes" / probe).is_file(), probe
    for args in _selections():
        assert (ROOT / args[0]).is_file(), args[0]


def test_every_test_selection_selects_a_test():
    """Collected here as on the GPU machine (the GPU tests are collected everywhere and
    skip at run time where no GPU is present)."""
    selections = _selections()
    out = subprocess.run(
        [sys.executable, "-c", COLLECT, json.dumps(selections)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("COUNTS ")]
    assert lines, out.stdout[-2000:] + out.stderr[-2000:]
    counts = json.loads(lines[-1][len("COUNTS ") :])
    empty = [" ".join(args) for args, n in zip(selections, counts, strict=True) if n == 0]
    assert not empty, f"run_gpu.sh selects no test with: {empty}"
