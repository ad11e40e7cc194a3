import os
import shutil
import subprocess
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
        "module_loading",
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
    for header in ("item_ctx.h", "slice.h"):  # what preempt.cuh includes
        assert os.path.isfile(os.path.join(fr.include_dir(), "freeride", header))


_HOOKS_PROBE = (
    "from freeride import _C; "
    "print(hasattr(_C, '_testing'), hasattr(_C, '_Latch'), "
    "hasattr(_C.Executor, '_submit_after_latch'), "
    "hasattr(_C.Executor, '_test_items_see_gate_closed'))"
)


@pytest.mark.parametrize(
    ("hooks", "expected"),
    [
        (None, "False False False False"),
        ("0", "False False False False"),
        ("1", "True False False False"),
    ],
)
def test_test_hooks_only_with_the_private_switch(hooks, expected):
    """The shipped module has no test hooks: _C._testing exists only where
    FREERIDE_TEST_HOOKS=1 at import, and none are left on _C or the Executor."""
    env = {k: v for k, v in os.environ.items() if k != "FREERIDE_TEST_HOOKS"}
    if hooks is not None:
        env["FREERIDE_TEST_HOOKS"] = hooks
    out = subprocess.run(
        [sys.executable, "-c", _HOOKS_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.split()[-4:] == expected.split()


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


# Messages and a type name compiled into libstdc++'s locale code (locale.cc,
# localename.cc, locale_init.cc): in a module's read-only data only if a copy of it is.
_LIBSTDCXX_LOCALE_DATA = (
    b"locale::_S_normalize_category category not found",
    b"locale::facet::_S_create_c_locale name not valid",
    b"NSt6locale5facetE",
)


def _private_libstdcxx(path):
    """(DT_NEEDED entries, evidence of a libstdc++ linked into the ELF object at `path`)."""
    elffile = pytest.importorskip("elftools.elf.elffile")
    with open(path, "rb") as f:
        elf = elffile.ELFFile(f)
        dynamic = elf.get_section_by_name(".dynamic")
        needed = [tag.needed for tag in dynamic.iter_tags() if tag.entry.d_tag == "DT_NEEDED"]
        # --exclude-libs,ALL keeps a static copy's symbols out of .dynsym, so .symtab is
        # where they show; Release builds are stripped of it (pybind11 strips them), so
        # the copy's own constant data is looked for as well.
        defined = [
            sym.name
            for name in (".dynsym", ".symtab")
            if (table := elf.get_section_by_name(name)) is not None
            for sym in table.iter_symbols()
            if sym["st_shndx"] != "SHN_UNDEF"
        ]
        rodata = elf.get_section_by_name(".rodata")
        data = rodata.data() if rodata is not None else b""
    evidence = [n for n in defined if n.startswith("_ZNSt6locale") or "codecvt" in n]
    evidence += [text.decode() for text in _LIBSTDCXX_LOCALE_DATA if text in data]
    return needed, evidence


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF shared objects only")
def test_extension_uses_the_shared_libstdcxx():
    """One libstdc++ per process: the module must not carry a static copy next to torch's
    (a toolchain that linked it statically made error formatting crash beside torch)."""
    needed, private_copy = _private_libstdcxx(_C.__file__)
    assert any(name.startswith("libstdc++.so") for name in needed), needed
    assert not private_copy, private_copy[:5]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF shared objects only")
def test_extension_links_the_cuda_runtime_statically():
    """The CUDA runtime keeps its last error per instance of itself and host thread
    (cudaGetLastError's documentation: "in the same instance of the CUDA Runtime library").
    freeride clears that error on the training thread after its own calls at an open; with
    the runtime linked statically the error cleared is freeride's alone, never one that
    torch's runtime (or a user extension's) holds for that thread and has yet to report."""
    needed, _ = _private_libstdcxx(_C.__file__)
    assert not [name for name in needed if name.startswith("libcudart")], needed
    # Nor does the module export the copy's symbols (--exclude-libs,ALL), which another
    # library loaded with RTLD_GLOBAL could bind to, sharing its state after all.
    elffile = pytest.importorskip("elftools.elf.elffile")
    with open(_C.__file__, "rb") as f:
        dynsym = elffile.ELFFile(f).get_section_by_name(".dynsym")
        exported = [
            sym.name
            for sym in dynsym.iter_symbols()
            if sym["st_shndx"] != "SHN_UNDEF" and sym.name.startswith(("cuda", "__cuda"))
        ]
    assert not exported, exported[:5]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF shared objects only")
@pytest.mark.parametrize("strip", [False, True], ids=["symtab", "stripped"])
def test_a_static_libstdcxx_is_detected(tmp_path, strip):
    """The check above fires on a library linked as the module is (--exclude-libs,ALL)
    with libstdc++ static, stripped or not."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    archive = subprocess.run(
        [cxx, "-print-file-name=libstdc++.a"], check=True, capture_output=True, text=True
    ).stdout.strip()
    if not os.path.isabs(archive):
        pytest.skip("no static libstdc++ to link")
    source = tmp_path / "locale.cpp"
    source.write_text(
        "#include <locale>\n"
        'extern "C" bool has_c_locale() { return std::locale("C") == std::locale::classic(); }\n'
    )
    library = tmp_path / "static.so"
    command = [cxx, "-shared", "-fPIC", "-O2", "-static-libstdc++", "-Wl,--exclude-libs,ALL"]
    subprocess.run(
        [*command, *(["-s"] if strip else []), str(source), "-o", str(library)], check=True
    )
    _, evidence = _private_libstdcxx(library)
    assert evidence
