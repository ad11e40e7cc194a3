"""Module paths that moved in 0.2, kept for one release: importing one (or reaching it as
an attribute of the package) warns with a DeprecationWarning and gives the module at its
new path, so ``from freeride.report import Report`` keeps working until then."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from typing import Any

MOVED = {
    "freeride.pipeline": "freeride.attach",
    "freeride.recorder": "freeride.record.recorder",
    "freeride.report": "freeride.record.report",
    "freeride.report_model": "freeride.record.model",
    "freeride.profiling": "freeride.record.profiler",
    "freeride.distributed": "freeride.record.ranks",
    "freeride.placement": "freeride.job.placement",
    "freeride.jobqueue": "freeride.job",
    "freeride.demo": "freeride.cli.demo",
    "freeride.bench": "freeride.cli.bench",
}
# The moved paths that were packages: their submodules moved with them.
PACKAGES = ("freeride.bench",)


def new_path(name: str) -> str | None:
    """Where the module `name` lives now, or None if it did not move."""
    if name in MOVED:
        return MOVED[name]
    for old in PACKAGES:
        if name.startswith(old + "."):  # freeride.bench.soak -> freeride.cli.bench.soak
            return MOVED[old] + name[len(old) :]
    return None


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"{old} moved to {new}; the old path goes in the next release",
        DeprecationWarning,
        stacklevel=_importer_level(),
    )


def _importer_level() -> int:
    """The stack level of the code that imported the old path, as warnings.warn counts
    (it passes over the import system's frozen frames by itself): past this file and
    importlib.import_module, so the warning names the user's line."""
    frame, level = sys._getframe(2), 2  # _warn's caller is level 2
    while frame is not None:
        name = frame.f_code.co_filename
        frozen = "importlib" in name and "_bootstrap" in name
        if not frozen and name != __file__ and frame.f_globals.get("__name__") != "importlib":
            return level
        frame = frame.f_back
        level += 0 if frozen else 1
    return 2


class _Alias(types.ModuleType):
    """The old module path: every attribute is the new module's."""

    def __init__(self, old: str, target: types.ModuleType) -> None:
        super().__init__(old, target.__doc__)
        self.__dict__["_target"] = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_target"], name)

    def __dir__(self) -> list[str]:
        return dir(self.__dict__["_target"])


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if new_path(name) is None:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=name in PACKAGES)

    def create_module(self, spec: Any) -> types.ModuleType:
        new = new_path(spec.name)
        _warn(spec.name, new)
        alias = _Alias(spec.name, importlib.import_module(new))
        if spec.name in PACKAGES:
            # Its own, empty: the new package's would let the path finder load the new
            # files a second time under the old names. Submodules come through here.
            alias.__path__ = []
        return alias

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def package_getattr(name: str) -> types.ModuleType:
    """``freeride.<name>`` for a moved module (the package's __getattr__)."""
    old = f"freeride.{name}"
    if old not in MOVED:
        raise AttributeError(f"module 'freeride' has no attribute {name!r}")
    return importlib.import_module(old)


if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
    sys.meta_path.append(_Finder())
