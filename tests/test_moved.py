"""Module paths that moved keep working for one release, with a DeprecationWarning."""

import importlib
import subprocess
import sys
import warnings

import pytest

import freeride as fr
from freeride._moved import MOVED, new_path

# (old path, a name that lived there)
OLD = [
    ("freeride.pipeline", "Attachment"),
    ("freeride.recorder", "Recorder"),
    ("freeride.report", "Report"),
    ("freeride.report_model", "Bubble"),
    ("freeride.profiling", "BubbleRanges"),
    ("freeride.distributed", "gather_reports"),
    ("freeride.placement", "TaskSpec"),
    ("freeride.jobqueue", "JobQueue"),
    ("freeride.demo", "DemoConfig"),
    ("freeride.bench", "run"),
]


def test_every_moved_path_is_listed_here():
    assert sorted(MOVED) == sorted(old for old, _ in OLD)


@pytest.mark.parametrize("old, name", OLD)
def test_an_old_path_warns_and_gives_the_same_objects(old, name):
    """Each in a fresh interpreter, so the first import (the one that warns) is this one."""
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        f"try:\n    from {old} import {name}\n"
        "except DeprecationWarning as w:\n    print('warned:', w)\n"
        "warnings.simplefilter('ignore')\n"
        f"from {old} import {name} as old\n"
        "import importlib\n"
        f"new = getattr(importlib.import_module({MOVED[old]!r}), {name!r})\n"
        "print('same' if old is new else 'different')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert f"warned: {old} moved to {MOVED[old]}" in out
    assert out.strip().endswith("same")


def test_submodules_of_a_moved_package_and_attribute_access():
    with pytest.warns(DeprecationWarning):
        soak = importlib.import_module("freeride.bench.soak")
    assert soak.counter is importlib.import_module("freeride.cli.bench.soak").counter
    # No file ran a second time under its old name (its relative imports would break).
    twice = [
        n
        for n, m in sys.modules.items()
        if n.startswith("freeride.bench.") and not isinstance(m, type(soak))
    ]
    assert not twice, twice
    assert new_path("freeride.bench.soak") == "freeride.cli.bench.soak"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # may be the first import
        assert fr.pipeline.Attachment is importlib.import_module("freeride.attach").Attachment


def test_the_warning_names_the_importing_line():
    for name in ("freeride.report_model", "freeride.profiling"):
        sys.modules.pop(name, None)
    with pytest.warns(DeprecationWarning) as statement:
        import freeride.report_model  # noqa: F401
    with pytest.warns(DeprecationWarning) as call:
        importlib.import_module("freeride.profiling")
    assert [w.filename for w in statement.list + call.list] == [__file__, __file__]


def test_paths_that_did_not_move_are_left_alone():
    assert new_path("freeride.harvester") is None
    assert new_path("freeride.benchmark") is None  # a prefix of a moved name is not one
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        fr.nonsense  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("freeride.pipeline.nonsense")
