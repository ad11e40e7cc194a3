"""The version a build gives freeride: the release alone from a source install, the release
with its CUDA major as a local label in the wheel packaging/build_wheel.sh makes."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SETUP = ROOT / "setup.py"

pytestmark = pytest.mark.skipif(not SETUP.is_file(), reason="needs the source tree")


def _version(label):
    pytest.importorskip("setuptools")
    env = {k: v for k, v in os.environ.items() if k != "FREERIDE_LOCAL_VERSION"}
    if label is not None:
        env["FREERIDE_LOCAL_VERSION"] = label
    return subprocess.run(
        [sys.executable, str(SETUP), "--version"],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_source_build_is_the_release_and_the_wheel_adds_its_cuda_major():
    plain = _version(None)
    assert plain.returncode == 0, plain.stderr
    release = plain.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+\.\d+\.\d+", release), release
    wheel = _version("cu13")
    assert wheel.returncode == 0, wheel.stderr
    assert wheel.stdout.strip().splitlines()[-1] == f"{release}+cu13"


@pytest.mark.parametrize("label", ["cu 13", "+cu13", "CU13", "cu13."])
def test_a_malformed_local_label_is_refused(label):
    out = _version(label)
    assert out.returncode != 0
    assert "FREERIDE_LOCAL_VERSION must be a PEP 440 local label" in out.stderr


def test_the_wheel_script_builds_sm80_sm90_sm100_and_newest_ptx():
    """The architectures docs/guide.md promises for the wheel."""
    script = ROOT / "packaging" / "build_wheel.sh"
    assert os.access(script, os.X_OK)
    default = re.search(r"archs=\$\{FREERIDE_CUDA_ARCHS:-([^}]*)\}", script.read_text())
    assert default, "no default architectures in build_wheel.sh"
    assert default.group(1).split(";") == ["80-real", "90-real", "100"]
