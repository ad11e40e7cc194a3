"""RawKernel: a side task written as CUDA source against freeride/preempt.cuh."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._C import function_info, raw_kernel_task, set_max_dynamic_shared
from .._checks import check_count
from ..errors import CudaUnavailableError
from . import _kernel_cache
from ._base import BoundTask, Task, describe
from ._signature import check_args, check_kinds, check_sizes, pack, warn_unchecked

# Dynamic shared memory above this needs the function's limit raised first.
_DEFAULT_SHARED_LIMIT = 48 * 1024
# The executor sums items over phases at submit; beyond this, use fewer, larger phases.
_MAX_PHASES = 2**24


class RawKernel(Task):
    """A user kernel, compiled by CuPy (NVRTC) and run as a preemptible side task.

    Every kernel takes ``fr_item_ctx ctx`` first and calls ``freeride::for_each_item``
    (or ``freeride::for_each_phase_item``, below; ``#include <freeride/preempt.cuh>``,
    the include path is added for you), then the arguments in `args`. Kernels must be
    ``extern "C"``.

    One phase: ``RawKernel(src, "scale", items=n_blocks, args=(x, 2.0, n))``.

    Arguments are checked against the compiled kernel's parameters as the CUDA driver
    reports them (cuFuncGetParamInfo, CUDA 12.4+): their count and each one's size, at
    ``compile()`` or ``submit()``. The driver gives sizes, not types, so what an argument
    is comes from the argument:

    - an array (a torch tensor or CuPy array on the harvester's device) is a pointer to
      its data, ``None`` a null pointer: the parameter must be 8 bytes;
    - a numpy scalar is its dtype (``np.float32(2.5)``, ``np.int32(3)``,
      ``np.uint64(n)``, ``np.float16(1)``): its size must be the parameter's;
    - a Python ``bool`` is a 1-byte ``bool``;
    - a Python ``int`` is an integer of the parameter's size (1, 2, 4 or 8 bytes) and
      must fit it, signed or unsigned;
    - a Python ``float`` is a ``float`` for a 4-byte parameter, a ``double`` for an
      8-byte one; a 2-byte ``__half`` or ``__nv_bfloat16`` takes a numpy scalar.

    So a Python ``2`` given to a ``float`` parameter arrives as the integer 2's bits,
    and a float64 tensor given to a ``float*`` is read as float32: write ``2.0`` (or
    ``np.float32(2)``) and pass arrays of the kernel's element types. Where the driver
    predates cuFuncGetParamInfo (before CUDA 12.4), nothing can be checked against the
    kernel: a RuntimeWarning says so, arrays, ``None``, numpy scalars and bools are
    passed as above, and plain Python ints and floats are refused with a TypeError
    (their size is the parameter's, which that driver cannot tell).

    Several phases, for iterative algorithms: `name` lists kernels and `phases` says how
    many phases to run; phase p runs ``name[p % len(name)]`` over
    ``items[p % len(items)]`` items (`items` is one count or one per name), and phases
    run strictly in order: every item of a phase finishes before the next phase starts.
    A kernel reads its phase index from ``ctx.phase`` (to pick ping-pong buffers, say).
    Every kernel named takes the same `args`, so their parameter sizes must agree.

    `device_phases=True` lets one launch serve every phase on the CUDA backend (unless
    ``FREERIDE_DEVICE_PHASES=0``): a launch queued at a bubble's open then goes on from
    phase to phase on the device, so a task of many short phases is not held to one phase per launch. It needs
    one kernel for every phase, which takes the phase from
    ``freeride::for_each_phase_item(ctx, [&](unsigned long long phase, unsigned long long
    item) {...})`` instead of ``ctx.phase``, and keeps the order above (every item of a
    phase finishes before an item of the next starts). Such a kernel runs the same
    without device phases; one that calls ``for_each_item`` there runs nothing, and the
    task fails saying why. In the body ``ctx.phase`` is then 0 and ``ctx.n_items`` counts
    every phase's items, and buffers an earlier phase wrote must be read through plain
    pointers (not ``const T* __restrict__``, ``__ldg`` or textures: those loads assume
    data that does not change during the launch).

    `block` is the threads per block; `shared_mem` the dynamic shared memory per block
    in bytes; `grid` the blocks per launch (default, and at most: as many as fit on the
    device at once beside the harvester's reserve, so that every block polls the gate
    instead of waiting behind others, and training's own kernels still find room);
    `options` extra NVRTC options. The task's memory is the bytes of its distinct array
    arguments, charged against the harvester's budget. ``result()`` returns `args`.

    Compiled modules are cached per process and device (and by CuPy on disk); source
    that does not compile raises ``fr.KernelCompileError`` with the compiler's log at
    ``compile()`` or ``submit()``, and the harvester stays usable.
    """

    def __init__(
        self,
        source: str,
        name: str | Sequence[str],
        items: int | Sequence[int],
        args: Sequence[Any] = (),
        block: int = 256,
        phases: int | None = None,
        *,
        shared_mem: int = 0,
        grid: int | None = None,
        options: Sequence[str] = (),
        device_phases: bool = False,
    ) -> None:
        _kernel_cache.require_cupy()
        if not isinstance(source, str) or not source.strip():
            raise TypeError("source must be a non-empty string of CUDA C++")
        names = (name,) if isinstance(name, str) else tuple(name)
        if not names or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise ValueError(f"name must be a kernel name or a sequence of them, got {name!r}")
        counts = (items,) if not isinstance(items, Sequence) else tuple(items)
        if len(counts) not in (1, len(names)):
            raise ValueError(
                f"items must be one count or one per kernel name ({len(names)}), got {len(counts)}"
            )
        self.items = tuple(check_count(c, "items") for c in counts)
        self.phases = check_count(
            len(names) if phases is None else phases, "phases", 1, _MAX_PHASES
        )
        if max(self.items) * self.phases > 2**63 - 1:
            raise ValueError("items * phases must fit in 63 bits")
        self.block = check_count(block, "block", 1, 1024)
        self.shared_mem = check_count(shared_mem, "shared_mem", 0, 2**31 - 1)
        self.grid = None if grid is None else check_count(grid, "grid", 1, 2**31 - 1)
        if isinstance(options, str) or not all(isinstance(o, str) for o in options):
            raise TypeError("options must be a sequence of strings")
        self.options = tuple(options)
        if not isinstance(device_phases, bool):
            raise TypeError(f"device_phases must be a bool, got {type(device_phases).__name__}")
        if device_phases and len(names) != 1:
            raise ValueError(
                "device_phases=True needs one kernel for every phase (its body takes the "
                f"phase from freeride::for_each_phase_item), got {len(names)} names"
            )
        self.device_phases = device_phases
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise TypeError(f"args must be a tuple or list, got {type(args).__name__}")
        self.args = tuple(args)
        self.source = source
        self.names = names
        check_kinds(self.args, names[0])

    def compile(self, device: int = 0) -> dict[str, int]:
        """Compiles the source for CUDA device `device` now (or finds it in the cache)
        and checks every kernel against this task's launch settings and arguments;
        returns the CUfunction handles by name. ``submit()`` does this too."""
        return self._compile(device)[0]

    def _compile(self, device: int) -> tuple[dict[str, int], list[int] | None]:
        """The handles by name, and the parameter sizes after the fr_item_ctx that every
        kernel shares (None where the driver cannot say)."""
        compiled = _kernel_cache.compile_module(self.source, self.names, self.options, device)
        cupy = _kernel_cache.require_cupy()
        sizes: dict[str, list[int] | None] = {}
        with cupy.cuda.Device(device):  # driver queries act on the device's context
            for name, function in compiled.functions.items():
                sizes[name] = self._check_function(name, function, device)
        first = sizes[self.names[0]]
        for other in self.names[1:]:
            if sizes[other] != first:
                raise TypeError(
                    f"kernels {self.names[0]!r} and {other!r} must take the same parameters, "
                    f"since they share args; the driver gives parameter sizes {first} and "
                    f"{sizes[other]} bytes after fr_item_ctx"
                )
        if first is None:
            warn_unchecked(self.names[0])
        check_args(first, self.args, self.names[0])
        return dict(compiled.functions), first

    def _check_function(self, name: str, function: int, device: int) -> list[int] | None:
        info = function_info(function)
        if self.block > info["max_threads_per_block"]:
            raise ValueError(
                f"block={self.block} exceeds what kernel {name!r} can run with "
                f"({info['max_threads_per_block']} threads per block, from its "
                "__launch_bounds__ or registers)"
            )
        sizes = info["param_sizes"]
        if sizes is not None:
            sizes = check_sizes(sizes, name)
        if self.shared_mem > _DEFAULT_SHARED_LIMIT:
            limit = _shared_optin(device)
            if self.shared_mem + info["static_shared_bytes"] > limit:
                raise ValueError(
                    f"shared_mem={self.shared_mem} plus kernel {name!r}'s static "
                    f"{info['static_shared_bytes']} bytes exceed cuda:{device}'s {limit} bytes "
                    "per block"
                )
            set_max_dynamic_shared(function, self.shared_mem)
        return sizes

    def _build(self, kind: str, device: int) -> BoundTask:
        if kind != "cuda":
            raise CudaUnavailableError(
                "fr.tasks.RawKernel runs CUDA kernels; this harvester uses the host backend. "
                "Submit it to a Harvester on a GPU (device='cuda:N')."
            )
        functions, sizes = self._compile(device)
        words, keep, memory = pack(sizes, self.args, self.names[0], kind, device)
        # The core runs phase p with kernel p % len(kernels): one entry per name, each
        # with its item count (one count for all names repeats it).
        kernels = [
            (
                functions[n],
                self.items[i % len(self.items)],
                self.block,
                self.shared_mem,
                self.grid or 0,
            )
            for i, n in enumerate(self.names)
        ]
        core = raw_kernel_task(
            f"RawKernel({self.names[0]})", kernels, self.phases, words, self.device_phases
        )
        core.memory_bytes = memory
        return BoundTask(core, lambda: self.args, keep=(*keep, self.args))

    @staticmethod
    def cache_info() -> _kernel_cache.CacheInfo:
        """Hits, misses and size of the in-process compile cache."""
        return _kernel_cache.cache_info()

    def __repr__(self) -> str:
        names = self.names[0] if len(self.names) == 1 else list(self.names)
        return describe(self, name=names, items=self.items, phases=self.phases, block=self.block)


def _shared_optin(device: int) -> int:
    cupy = _kernel_cache.require_cupy()
    return int(cupy.cuda.Device(device).attributes["MaxSharedMemoryPerBlockOptin"])
