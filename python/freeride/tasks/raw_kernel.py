"""RawKernel: a side task written as CUDA source against freeride/preempt.cuh."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _C
from ..errors import CudaUnavailableError
from . import _kernel_cache
from ._base import Built, Task, check_count, describe
from ._signature import CTX_BYTES, Param, check_scalars, pack, parse_kernel

# Dynamic shared memory above this needs the function's limit raised first.
_DEFAULT_SHARED_LIMIT = 48 * 1024
# The executor sums items over phases at submit; beyond this, use fewer, larger phases.
_MAX_PHASES = 2**24


class RawKernel(Task):
    """A user kernel, compiled by CuPy (NVRTC) and run as a preemptible side task.

    Every kernel takes ``fr_item_ctx ctx`` first and calls ``freeride::for_each_item``
    (``#include <freeride/preempt.cuh>``; the include path is added for you), then the
    arguments in `args`, which are checked against the parameter list in `source`:
    pointers take arrays (torch tensors or CuPy arrays on the harvester's device, of the
    pointer's element type; ``None`` for a null pointer), scalars take Python or numpy
    numbers that fit the parameter's type. Kernels must be ``extern "C"``.

    One phase: ``RawKernel(src, "scale", items=n_blocks, args=(x, 2.0, n))``.

    Several phases, for iterative algorithms: `name` lists kernels and `phases` says how
    many phases to run; phase p runs ``name[p % len(name)]`` over
    ``items[p % len(items)]`` items (`items` is one count or one per name), and phases
    run strictly in order: every item of a phase finishes before the next phase starts.
    A kernel reads its phase index from ``ctx.phase`` (to pick ping-pong buffers, say).
    Every kernel named takes the same `args`.

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
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise TypeError(f"args must be a tuple or list, got {type(args).__name__}")
        self.args = tuple(args)
        self.source = source
        self.names = names
        self.params: list[Param] = parse_kernel(source, names[0])
        for other in names[1:]:
            theirs = parse_kernel(source, other)
            if [p.ctype for p in theirs] != [p.ctype for p in self.params]:
                raise ValueError(
                    f"kernels {names[0]!r} and {other!r} must take the same parameters, since "
                    f"they share args; got ({self._listed(self.params)}) and "
                    f"({self._listed(theirs)})"
                )
        check_scalars(self.params, self.args, names[0])

    @staticmethod
    def _listed(params: list[Param]) -> str:
        return ", ".join(p.describe() for p in params)

    def compile(self, device: int = 0) -> dict[str, int]:
        """Compiles the source for CUDA device `device` now (or finds it in the cache)
        and checks every kernel against this task's launch settings; returns the
        CUfunction handles by name. ``submit()`` does this too."""
        compiled = _kernel_cache.compile_module(self.source, self.names, self.options, device)
        cupy = _kernel_cache.require_cupy()
        with cupy.cuda.Device(device):  # driver queries act on the device's context
            for name, function in compiled.functions.items():
                self._check_function(name, function, device)
        return dict(compiled.functions)

    def _check_function(self, name: str, function: int, device: int) -> None:
        info = _C.function_info(function)
        if self.block > info["max_threads_per_block"]:
            raise ValueError(
                f"block={self.block} exceeds what kernel {name!r} can run with "
                f"({info['max_threads_per_block']} threads per block, from its "
                "__launch_bounds__ or registers)"
            )
        sizes = info["param_sizes"]
        expected = [CTX_BYTES] + [p.size for p in self.params]
        if sizes is not None and sizes != expected:
            raise TypeError(
                f"kernel {name!r} as compiled takes parameters of sizes {sizes} bytes, but its "
                f"source reads as (fr_item_ctx, {self._listed(self.params)}), sizes {expected}; "
                "is a macro or typedef hiding its real signature?"
            )
        if self.shared_mem > _DEFAULT_SHARED_LIMIT:
            limit = _shared_optin(device)
            if self.shared_mem + info["static_shared_bytes"] > limit:
                raise ValueError(
                    f"shared_mem={self.shared_mem} plus kernel {name!r}'s static "
                    f"{info['static_shared_bytes']} bytes exceed cuda:{device}'s {limit} bytes "
                    "per block"
                )
            _C.set_max_dynamic_shared(function, self.shared_mem)

    def _build(self, harvester: Any) -> Built:
        kind, device = harvester._kind, harvester._device_index
        if kind != "cuda":
            raise CudaUnavailableError(
                "fr.tasks.RawKernel runs CUDA kernels; this harvester uses the host backend. "
                "Submit it to a Harvester on a GPU (device='cuda:N')."
            )
        words, keep, memory = pack(self.params, self.args, self.names[0], kind, device)
        functions = self.compile(device)
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
        core = _C.raw_kernel_task(f"RawKernel({self.names[0]})", kernels, self.phases, words)
        core.memory_bytes = memory
        return Built(core, lambda: self.args, keep=(*keep, self.args))

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
