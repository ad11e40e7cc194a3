"""Kernel signatures read from CUDA source, and arguments checked and packed against them.

CuPy passes whatever it is given to a kernel: a Python int to a `float` parameter, or a
float64 tensor to a `float*`, compiles and runs and gives wrong output. RawKernel reads
each kernel's parameter list from its source instead and refuses arguments that do not
match, before anything is compiled or launched. Where the driver can say (CUDA 12.4+),
the compiled kernel's parameter sizes are checked against this reading too.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _C
from .._arrays import as_array

# sizeof(fr_item_ctx), the first parameter of every preemptible kernel.
CTX_BYTES: int = _C.ITEM_CTX_BYTES

_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct"}
_INT_WORDS = {"signed", "unsigned", "short", "long", "int", "char"}
_NAMED = {
    "bool": "bool",
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "__half": "float16",
    "__nv_bfloat16": "bfloat16",
    "nv_bfloat16": "bfloat16",
    "size_t": "uint64",
    "ptrdiff_t": "int64",
    "int8_t": "int8",
    "int16_t": "int16",
    "int32_t": "int32",
    "int64_t": "int64",
    "uint8_t": "uint8",
    "uint16_t": "uint16",
    "uint32_t": "uint32",
    "uint64_t": "uint64",
}
_SIZES = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
}


@dataclass(frozen=True)
class Param:
    """One kernel parameter after the fr_item_ctx.

    `dtype` is the numpy name of a scalar parameter's type or of a pointer's element
    type; None where the source names a type RawKernel does not know (a struct, a
    typedef): a pointer to it takes an array of any dtype, a scalar of it is refused.
    """

    name: str
    ctype: str
    pointer: bool
    const: bool
    dtype: str | None

    @property
    def size(self) -> int | None:
        """Bytes the parameter occupies, None where unknown."""
        if self.pointer:
            return 8
        return _SIZES.get(self.dtype) if self.dtype else None

    def describe(self) -> str:
        return f"{self.ctype} {self.name}".strip()


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", " ", source)


def _integer_dtype(words: list[str]) -> str | None:
    """The numpy dtype of a C integer type spelled with signed/unsigned/short/long/int/char,
    as on the device (LP64: long is 64-bit; plain char is signed)."""
    unsigned = "unsigned" in words
    longs = words.count("long")
    if "char" in words:
        bits = 8
    elif "short" in words:
        bits = 16
    elif longs:
        bits = 64
    else:
        bits = 32
    return f"{'u' if unsigned else ''}int{bits}"


def _scalar_dtype(words: list[str]) -> str | None:
    if not words:
        return None
    if all(w in _INT_WORDS for w in words):
        return _integer_dtype(words)
    if len(words) == 1:
        return _NAMED.get(words[0].split("::")[-1])
    return None


def _split_params(text: str) -> list[str]:
    """Splits a parameter list at commas outside <>, () and []."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _parse_param(text: str, kernel: str, index: int) -> Param:
    if "=" in text:
        text = text.split("=", 1)[0]
    tokens = re.findall(r"[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*|\*|&|\[|\]", text)
    if "&" in tokens:
        raise ValueError(
            f"parameter {index} of kernel {kernel!r} ({text.strip()}) is a reference; "
            "kernels take pointers or values"
        )
    pointer = tokens.count("*") + tokens.count("[") > 0
    if tokens.count("*") + tokens.count("[") > 1:
        raise ValueError(
            f"parameter {index} of kernel {kernel!r} ({text.strip()}) is a pointer to a "
            "pointer, which RawKernel cannot check"
        )
    first_star = min((tokens.index(t) for t in ("*", "[") if t in tokens), default=len(tokens))
    const = "const" in tokens[:first_star]  # a const pointee, not a const pointer
    words = [t for t in tokens if t not in ("*", "[", "]")]
    words = [w for w in words if w not in _QUALIFIERS]
    name = ""
    if len(words) >= 2 and words[-1] not in _INT_WORDS and words[-1] not in _NAMED:
        name = words.pop()
    if not words:
        raise ValueError(f"cannot read the type of parameter {index} of kernel {kernel!r}")
    ctype = " ".join(words) + ("*" if pointer else "")
    if const:
        ctype = "const " + ctype
    dtype = None if words == ["void"] else _scalar_dtype(words)
    return Param(name or f"arg{index}", ctype, pointer, const, dtype)


def parse_kernel(source: str, kernel: str) -> list[Param]:
    """The parameters of __global__ function `kernel` after its leading fr_item_ctx.
    Raises ValueError where the source has no such kernel or its first parameter is not
    a fr_item_ctx taken by value."""
    code = _strip_comments(source)
    pattern = re.compile(r"\b__global__\b[^;{}]*?\b" + re.escape(kernel) + r"\s*\(")
    match = pattern.search(code)
    if match is None:
        raise ValueError(f"no __global__ function named {kernel!r} in the source")
    depth, i = 1, match.end()
    while i < len(code) and depth:
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        i += 1
    if depth:
        raise ValueError(f"unbalanced parentheses in the parameter list of kernel {kernel!r}")
    params = _split_params(code[match.end() : i - 1])
    if params == ["void"]:
        params = []
    first = params[0] if params else ""
    first_words = [w for w in re.findall(r"[A-Za-z_]\w*|\*|&", first) if w not in _QUALIFIERS]
    if (
        not first_words
        or first_words[0] != "fr_item_ctx"
        or "*" in first_words
        or "&" in first_words
    ):
        raise ValueError(
            f"the first parameter of kernel {kernel!r} must be `fr_item_ctx ctx` (by value), "
            f"got {first or 'none'!r}"
        )
    return [_parse_param(p, kernel, i) for i, p in enumerate(params[1:], start=1)]


def _is_array(value: Any) -> bool:
    return (
        isinstance(value, np.ndarray)
        or hasattr(value, "__cuda_array_interface__")
        or (type(value).__module__.startswith("torch") and hasattr(value, "data_ptr"))
    )


def scalar_word(value: Any, param: Param, kernel: str) -> int:
    """The 8-byte little-endian word that holds `value` as the parameter's type; the
    driver reads the parameter's size from its start."""
    where = f"argument {param.name!r} of kernel {kernel!r} ({param.describe()})"
    if param.dtype is None:
        raise TypeError(
            f"{where}: RawKernel cannot check values of type {param.ctype!r}; pass it through "
            "a pointer to an array, or use a built-in scalar type"
        )
    if _is_array(value):
        raise TypeError(f"{where} is a scalar, got an array ({type(value).__name__})")
    dtype = np.dtype(param.dtype) if param.dtype != "bfloat16" else None
    if param.dtype == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{where} must be a bool, got {type(value).__name__}")
        return int(bool(value))
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where} must be a number, got a bool")
    if dtype is not None and dtype.kind in "iu":
        if isinstance(value, (float, np.floating)):
            raise TypeError(f"{where} is an integer, got a float ({value!r})")
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"{where} must be an integer, got {type(value).__name__}") from None
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise ValueError(f"{where} must be in [{info.min}, {info.max}], got {value}")
        return int.from_bytes(np.array(value, dtype=dtype).tobytes(), "little")
    if not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{where} must be a real number, got {type(value).__name__}")
    value = float(value)
    if param.dtype == "bfloat16":
        bits = int(np.array(value, dtype=np.float32).view(np.uint32))
        return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
    finfo = np.finfo(dtype)
    if np.isfinite(value) and abs(value) > float(finfo.max):
        raise ValueError(f"{where} is out of range for {param.dtype}: {value}")
    return int.from_bytes(np.array(value, dtype=dtype).tobytes(), "little")


def check_scalars(params: list[Param], args: tuple, kernel: str) -> None:
    """What can be checked without a device: the count, and every scalar argument."""
    if len(args) != len(params):
        listed = ", ".join(p.describe() for p in params) or "nothing"
        raise TypeError(
            f"kernel {kernel!r} takes {len(params)} argument(s) after fr_item_ctx ({listed}), "
            f"got {len(args)}"
        )
    for param, value in zip(params, args):
        if param.pointer:
            if value is not None and not _is_array(value):
                raise TypeError(
                    f"argument {param.name!r} of kernel {kernel!r} ({param.describe()}) must be "
                    f"an array on the harvester's device or None, got {type(value).__name__}"
                )
        else:
            scalar_word(value, param, kernel)


def pack(
    params: list[Param], args: tuple, kernel: str, kind: str, device: int
) -> tuple[list[int], list[Any], int]:
    """Checks every argument against its parameter on the harvester's device; returns the
    words to launch with, the arrays to keep alive, and the bytes of distinct arrays."""
    check_scalars(params, args, kernel)
    words: list[int] = []
    keep: list[Any] = []
    seen: dict[int, int] = {}
    for param, value in zip(params, args):
        if not param.pointer:
            words.append(scalar_word(value, param, kernel))
            continue
        if value is None:
            words.append(0)
            continue
        dtypes = None
        if param.dtype is not None:
            # A bool array is bytes: accept it for unsigned char / uint8_t too.
            dtypes = ("uint8", "bool") if param.dtype == "uint8" else (param.dtype,)
        ref = as_array(
            value,
            f"argument {param.name!r} of kernel {kernel!r} ({param.describe()})",
            kind,
            device,
            dtypes=dtypes,
            writable=not param.const,
        )
        words.append(ref.ptr)
        keep.append(ref)
        seen[ref.ptr] = max(seen.get(ref.ptr, 0), ref.nbytes)
    return words, keep, sum(seen.values())
