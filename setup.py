"""Build freeride: setuptools hands the extension to CMake + ninja (after pybind11's cmake_example).

Environment:
  FREERIDE_CUDA=0/1        force the CPU-only or the CUDA build (default: CUDA when nvcc is found)
  FREERIDE_CUDA_ARCHS=...  CMAKE_CUDA_ARCHITECTURES (default "80-real;90": sm_80, sm_90 + PTX)
  FREERIDE_BUILD_TYPE=...  CMake build type (default Release)
  FREERIDE_LOCAL_VERSION=. a PEP 440 local version label appended to VERSION, e.g. "cu13"
                           (0.2.0+cu13): how the wheel packaging/build_wheel.sh makes
                           names the CUDA major its runtime is (none by default)
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# The release; pyproject.toml names "version" dynamic so that a build can add a local label.
VERSION = "0.2.0"


def version() -> str:
    label = os.environ.get("FREERIDE_LOCAL_VERSION", "").strip()
    if not label:
        return VERSION
    if not re.fullmatch(r"[a-z0-9]+(?:\.[a-z0-9]+)*", label):
        raise RuntimeError(
            f"FREERIDE_LOCAL_VERSION must be a PEP 440 local label such as cu13, got {label!r}"
        )
    return f"{VERSION}+{label}"


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: CMakeExtension) -> None:
        import pybind11

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_type = os.environ.get("FREERIDE_BUILD_TYPE", "Release")
        args = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}{os.sep}",
            f"-DCMAKE_BUILD_TYPE={build_type}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
        ]
        cuda = os.environ.get("FREERIDE_CUDA", "").strip().lower()
        if cuda in ("0", "off", "false", "no"):
            args.append("-DFREERIDE_CUDA=OFF")
        elif cuda in ("1", "on", "true", "yes"):
            args.append("-DFREERIDE_CUDA=ON")
        elif cuda not in ("", "auto"):
            raise RuntimeError(f"FREERIDE_CUDA must be 0, 1 or auto, got {cuda!r}")
        if os.environ.get("FREERIDE_CUDA_ARCHS"):
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={os.environ['FREERIDE_CUDA_ARCHS']}")
        if shutil.which("ninja"):
            args.append("-GNinja")

        build_dir = Path(self.build_temp) / ext.name
        build_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cmake", str(ROOT), *args], cwd=build_dir, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
        subprocess.run(
            ["cmake", "--build", ".", "--config", build_type, "--parallel", jobs],
            cwd=build_dir,
            check=True,
        )
        # Public headers travel with the package, for fr.include_dir() and user kernels.
        headers = out_dir / "include" / "freeride"
        headers.mkdir(parents=True, exist_ok=True)
        for header in (ROOT / "csrc" / "include" / "freeride").iterdir():
            shutil.copy2(header, headers / header.name)


setup(
    version=version(),
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[CMakeExtension("freeride._C")],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
