"""The guide's "Settings in the environment" lists every FREERIDE_ variable the package
reads at run time (the C++ core's getenv and switches, the Python layer's os.environ),
so that a switch added to the code without a line for its users fails here."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Read by the code but not a setting: the pipeline benchmark's mark on its own children.
INTERNAL = {"FREERIDE_BENCH_PIPELINE_CHILD"}
_READS = re.compile(
    r"""(?:getenv|env_switch)\(\s*"(FREERIDE_\w+)"|environ(?:\.get)?[(\[]\s*"(FREERIDE_\w+)"|"""
    r"""^_\w+ = "(FREERIDE_\w+)"$""",
    re.MULTILINE,
)


def read_by_the_code() -> set[str]:
    names = set()
    for folder, pattern in (("csrc", "*.[ch]pp"), ("python/freeride", "*.py")):
        for path in (ROOT / folder).rglob(pattern):
            for match in _READS.finditer(path.read_text()):
                names.add(next(g for g in match.groups() if g))
    return names - INTERNAL


def settings_table() -> str:
    guide = (ROOT / "docs" / "guide.md").read_text()
    start = guide.index("## Settings in the environment")
    end = guide.index("\n## ", start + 1)
    return guide[start:end]


def test_the_code_reads_the_switches_this_test_knows_of():
    """The search finds what it should (a pattern that found nothing would pass below)."""
    names = read_by_the_code()
    for known in ("FREERIDE_DEVICE_PHASES", "FREERIDE_MAX_LOOKAHEAD", "FREERIDE_NVTX"):
        assert known in names, sorted(names)


def test_every_setting_the_code_reads_is_in_the_guide():
    table = settings_table()
    missing = sorted(n for n in read_by_the_code() if f"`{n}`" not in table)
    assert not missing, f"add these to docs/guide.md's settings table: {missing}"
