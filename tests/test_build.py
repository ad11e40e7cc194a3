import os
import sys

import pytest

import freeride as fr
from freeride import _C


def test_backend_info_shape():
    info = fr.backend_info()
    for key in (
        "cuda",
        "cuda_built",
        "devices",
        "stream_mem_ops",
        "version",
        "runtime_version",
        "driver_version",
        "default_backend",
    ):
        assert key in info
    assert isinstance(info["devices"], list)
    if not info["cuda"]:
        assert info["reason"]
        assert info["default_backend"] == "host"


@pytest.mark.skipif(
    os.environ.get("FREERIDE_EXPECT_CUDA_BUILD") != "1",
    reason="only where the build is expected to include CUDA (CI sets it)",
)
def test_cuda_backend_compiled_in():
    assert _C.CUDA_BUILT
    assert fr.backend_info()["cuda_built"]
    assert fr.backend_info()["runtime_version"] >= 12000


def test_include_dir_ships_preempt_header():
    path = os.path.join(fr.include_dir(), "freeride", "preempt.cuh")
    assert os.path.isfile(path)
    with open(path) as f:
        assert "for_each_item" in f.read()
    assert os.path.isfile(os.path.join(fr.include_dir(), "freeride", "item_ctx.h"))


def test_auto_device_picks_available_backend():
    with fr.Harvester("auto") as h:
        assert h.backend == fr.backend_info()["default_backend"]
    with fr.Harvester(None) as h:
        assert h.backend == fr.backend_info()["default_backend"]


@pytest.mark.skipif(fr.backend_info()["cuda"], reason="needs a machine without a GPU")
def test_cuda_requested_without_gpu_is_refused():
    for device in ("cuda", "cuda:0", 0):
        with pytest.raises(fr.CudaUnavailableError, match="CUDA is unavailable"):
            fr.Harvester(device)


@pytest.mark.skipif(
    not fr.backend_info()["cuda_built"] or fr.backend_info()["driver_version"] != 0,
    reason="needs the CUDA build on a machine without an NVIDIA driver (CI's build machine)",
)
def test_missing_driver_is_named_as_such():
    """The runtime reports a missing driver as an insufficient one; say what it is."""
    reason = fr.backend_info()["reason"]
    assert reason.startswith("no NVIDIA driver found"), reason
    assert "insufficient" not in reason


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF shared objects only")
def test_extension_uses_the_shared_libstdcxx():
    """One libstdc++ per process: the module must not carry a static copy next to torch's
    (a toolchain that linked it statically made error formatting crash beside torch)."""
    elffile = pytest.importorskip("elftools.elf.elffile")
    with open(_C.__file__, "rb") as f:
        elf = elffile.ELFFile(f)
        dynamic = elf.get_section_by_name(".dynamic")
        needed = [tag.needed for tag in dynamic.iter_tags() if tag.entry.d_tag == "DT_NEEDED"]
        defined = [
            sym.name
            for sym in elf.get_section_by_name(".dynsym").iter_symbols()
            if sym["st_shndx"] != "SHN_UNDEF"
        ]
    assert any(name.startswith("libstdc++.so") for name in needed), needed
    private_copy = [n for n in defined if n.startswith("_ZNSt6locale") or "codecvt" in n]
    assert not private_copy, private_copy[:5]
