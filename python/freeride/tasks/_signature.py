"""A RawKernel's arguments checked against the compiled kernel's signature, as the CUDA
driver reports it, and packed into the words the core launches with. (Until issue 21
this module read signatures from the CUDA source with regular expressions; the driver
knows them better.)

The driver knows each compiled kernel's parameters: cuFuncGetParamInfo (CUDA 12.4+)
gives every parameter's size, read here through ``function_info``. The sizes check
the count of arguments and each one's size; what each argument is comes from the
argument itself:

- an array (torch tensor, ``__cuda_array_interface__`` object) or ``None`` is a pointer,
  8 bytes;
- a numpy scalar (``np.float32(2.5)``, ``np.uint64(n)``, ``np.bool_(True)``, a bfloat16
  scalar of ml_dtypes...) is its dtype's bytes, which must be the parameter's size;
- a Python ``bool`` is a 1-byte ``bool``;
- a Python ``int`` is an integer of the parameter's size (1, 2, 4 or 8 bytes) and must
  fit it, signed or unsigned: in [-2**(8s-1), 2**(8s) - 1];
- a Python ``float`` is a ``float`` for a 4-byte parameter, a ``double`` for an 8-byte
  one (for a 2-byte ``__half`` or ``__nv_bfloat16``, pass a numpy scalar).

Sizes are all the driver knows, not types: an int passed where the kernel takes a float
of the same size, a float where it takes an integer, an integer where it takes a
pointer, or an array of the wrong dtype, is not caught. Where the driver predates
cuFuncGetParamInfo, nothing is checked against the kernel: arrays, None, numpy scalars
and bools go as above (with a warning), and plain Python ints and floats, whose size
only the parameter could say, are refused.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._arrays import as_array
from .._C import ITEM_CTX_BYTES

# sizeof(fr_item_ctx), the first parameter of every preemptible kernel.
CTX_BYTES: int = ITEM_CTX_BYTES
# The core launches with one 8-byte little-endian word per parameter after the context;
# a parameter of size s reads the word's first s bytes.
WORD_BYTES = 8
POINTER_BYTES = 8
DRIVER_NEEDED = "a CUDA 12.4 or later driver (R550+), which has cuFuncGetParamInfo"
_INT_SIZES = (1, 2, 4, 8)
_FLOAT_DTYPES = {4: np.float32, 8: np.float64}


def is_array(value: Any) -> bool:
    """Whether `value` goes to the kernel as a pointer to its data."""
    return (
        isinstance(value, np.ndarray)
        or hasattr(value, "__cuda_array_interface__")
        or (type(value).__module__.startswith("torch") and hasattr(value, "data_ptr"))
    )


def _is_numpy_scalar(value: Any) -> bool:
    return (
        isinstance(value, np.generic)
        and value.dtype.kind in "biufcV"
        and value.dtype.fields is None
    )


def _a(word: object) -> str:
    """`word` with its indefinite article: "a 4-byte", "an 8-byte", "an int32"."""
    text = str(word)
    return f"{'an' if text[:1] in 'aeiou8' else 'a'} {text}"


def _sized(size: int | None) -> str:
    return _a(f"{size}-byte")


def _where(index: int, kernel: str) -> str:
    return f"args[{index}] of kernel {kernel!r}"


def check_kinds(args: Sequence[Any], kernel: str) -> None:
    """What can be checked without the compiled kernel: every argument is something
    RawKernel can pass (an array, None, a numpy scalar, a bool, an int or a float)."""
    for i, value in enumerate(args):
        if value is None or is_array(value) or _is_numpy_scalar(value):
            continue
        if isinstance(value, (bool, int, float)):
            continue
        raise TypeError(
            f"{_where(i, kernel)} must be an array on the harvester's device, None (a null "
            f"pointer), a number or a numpy scalar, got {type(value).__name__}"
        )


def check_sizes(sizes: Sequence[int], kernel: str) -> list[int]:
    """`sizes`: every parameter of the compiled kernel, as the driver gives them. Checks
    the first is a fr_item_ctx by value and every other fits a launch word; returns the
    sizes after the context."""
    sizes = [int(s) for s in sizes]
    if not sizes or sizes[0] != CTX_BYTES:
        first = f"{sizes[0]} bytes" if sizes else "no parameter"
        raise TypeError(
            f"the first parameter of kernel {kernel!r} must be `fr_item_ctx ctx` (by value, "
            f"{CTX_BYTES} bytes), but the compiled kernel's is {first}"
        )
    for i, size in enumerate(sizes[1:]):
        if not 0 < size <= WORD_BYTES:
            raise TypeError(
                f"parameter {i + 1} of kernel {kernel!r} (for args[{i}]) is {size} bytes in "
                f"the compiled kernel; RawKernel passes pointers and scalars of at most "
                f"{WORD_BYTES} bytes: pass a struct through a pointer to an array"
            )
    return sizes[1:]


def check_args(sizes: Sequence[int] | None, args: Sequence[Any], kernel: str) -> None:
    """Checks the count of `args` and each one against its parameter's size (`sizes`:
    those after the fr_item_ctx, from the driver; None where the driver cannot say, and
    then only the arguments that carry their size are taken)."""
    check_kinds(args, kernel)
    if sizes is not None and len(args) != len(sizes):
        raise TypeError(
            f"kernel {kernel!r} takes {len(sizes)} argument(s) after fr_item_ctx (of "
            f"{list(sizes)} bytes, from the driver), got {len(args)}"
        )
    for i, value in enumerate(args):
        size = None if sizes is None else sizes[i]
        if value is not None and not is_array(value):
            scalar_word(value, size, _where(i, kernel))
        elif size is not None and size != POINTER_BYTES:
            scalar_word(value, size, _where(i, kernel))  # raises: a pointer for a scalar


def warn_unchecked(kernel: str) -> None:
    # Tests reach this on a new driver by hiding newer entry points (csrc/cuda/driver.hpp).
    hidden = os.environ.get("FREERIDE_DRIVER_API_MAX", "")
    why = f", or FREERIDE_DRIVER_API_MAX={hidden} hides it" if hidden else ""
    warnings.warn(
        f"this CUDA driver cannot report kernel parameters (that needs {DRIVER_NEEDED}"
        f"{why}): "
        f"the count and sizes of kernel {kernel!r}'s arguments are not checked, and plain "
        "Python numbers are refused (pass numpy scalars such as np.float32(x))",
        RuntimeWarning,
        stacklevel=3,
    )


def scalar_word(value: Any, size: int | None, where: str) -> int:
    """The little-endian word holding scalar `value` as a parameter of `size` bytes
    (None: the driver cannot say, and only values that carry their size are taken)."""
    if value is None or is_array(value):
        got = "None (a null pointer)" if value is None else f"an array ({type(value).__name__})"
        raise TypeError(
            f"{where} is {_sized(size)} parameter in the compiled kernel, got {got}, which "
            f"passes {_sized(POINTER_BYTES)} pointer"
        )
    if isinstance(value, (bool, np.bool_)):
        if size not in (None, 1):
            raise TypeError(
                f"{where} is {_sized(size)} parameter in the compiled kernel, got a bool "
                "(1 byte); pass an int for an integer parameter"
            )
        return int(bool(value))
    if _is_numpy_scalar(value):
        nbytes = value.dtype.itemsize
        if size is not None and nbytes != size:
            raise TypeError(
                f"{where} is {_sized(size)} parameter in the compiled kernel, got "
                f"{_a(value.dtype.name)} scalar ({nbytes} bytes)"
            )
        if nbytes > WORD_BYTES:
            raise TypeError(
                f"{where}: {_a(value.dtype.name)} scalar is more than {WORD_BYTES} bytes"
            )
        return int.from_bytes(value.tobytes(), "little")
    if not isinstance(value, (int, float)):
        raise TypeError(f"{where} must be a number or a numpy scalar, got {type(value).__name__}")
    if size is None:
        raise TypeError(
            f"{where} is a Python {type(value).__name__}, whose size only the kernel's "
            f"parameter could say, and this driver cannot report it (that needs "
            f"{DRIVER_NEEDED}); pass a numpy scalar of the parameter's type, such as "
            f"np.float32({value!r}) or np.uint64({value!r})"
        )
    if isinstance(value, int):
        if size not in _INT_SIZES:
            raise TypeError(f"{where} is {_sized(size)} parameter; an int goes as 1, 2, 4 or 8")
        low, high = -(2 ** (8 * size - 1)), 2 ** (8 * size) - 1
        if not low <= value <= high:
            raise ValueError(
                f"{where} is {_sized(size)} integer parameter: must be in [{low}, {high}], "
                f"got {value}"
            )
        return value & (2 ** (8 * size) - 1)
    dtype = _FLOAT_DTYPES.get(size)
    if dtype is None:
        hint = " (np.float16 for __half, a bfloat16 scalar for __nv_bfloat16)" if size == 2 else ""
        raise TypeError(
            f"{where} is {_sized(size)} parameter, got a Python float, which goes as a "
            f"4-byte float or an 8-byte double; pass a numpy scalar of the parameter's "
            f"type{hint}"
        )
    if np.isfinite(value) and abs(value) > float(np.finfo(dtype).max):
        raise ValueError(f"{where} is out of range for {_sized(size)} float: {value}")
    return int.from_bytes(np.array(value, dtype=dtype).tobytes(), "little")


def pack(
    sizes: Sequence[int] | None, args: Sequence[Any], kernel: str, kind: str, device: int
) -> tuple[list[int], list[Any], int]:
    """Checks every argument against its parameter's size (`sizes`: those after the
    fr_item_ctx, from the driver; None where the driver cannot say) on the harvester's
    device; returns the words to launch with, the arrays to keep alive, and the bytes of
    the distinct arrays."""
    check_args(sizes, args, kernel)
    words: list[int] = []
    keep: list[Any] = []
    seen: dict[int, int] = {}
    for i, value in enumerate(args):
        size = None if sizes is None else sizes[i]
        where = _where(i, kernel)
        if value is not None and not is_array(value):
            words.append(scalar_word(value, size, where))
            continue
        if value is None:
            words.append(0)
            continue
        ref = as_array(value, where, kind, device, dtypes=None)
        words.append(ref.ptr)
        keep.append(ref)
        seen[ref.ptr] = max(seen.get(ref.ptr, 0), ref.nbytes)
    return words, keep, sum(seen.values())
