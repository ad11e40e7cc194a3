"""Image processing side tasks: Gaussian blur and bilinear resize over image batches."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._arrays import ArrayRef, as_array, check_dense
from .._C import gaussian_blur_task, resize_task
from .._checks import check_count, check_float
from ._base import BoundTask, Task, describe, upload, zeros

_DTYPES = ("uint8", "float32")
# Output rows per item: a few microseconds of a block's time for typical image widths.
_ROWS_PER_ITEM = 8


def _shape_of(images: Any) -> tuple[int, ...]:
    check_dense(images, "images")  # (a nested tensor's shape raises torch's internal error)
    shape = getattr(images, "shape", None)
    if shape is None:
        raise TypeError(f"images must be a torch tensor or an array, got {type(images).__name__}")
    shape = tuple(int(d) for d in shape)
    if len(shape) not in (3, 4):
        raise ValueError(f"images must be shaped (N, H, W) or (N, C, H, W), got {shape}")
    if min(shape) <= 0:
        raise ValueError(f"images must not be empty, got shape {shape}")
    return shape


class _ImageTask(Task):
    def __init__(self, images: Any) -> None:
        self.images = images
        self.shape = _shape_of(images)

    def _source(self, kind: str, device: int) -> ArrayRef:
        """The images, checked against the harvester's backend `kind` and `device`
        (nothing allocated)."""
        src = as_array(self.images, "images", kind, device, dtypes=_DTYPES)
        # The kernels read self.shape's elements: an array resized since (torch's set_ or
        # resize_, numpy's resize) would have them read past its end.
        now = tuple(int(d) for d in getattr(self.images, "shape", ()))
        if now != self.shape:
            raise ValueError(
                f"images changed shape since the task was made: {self.shape} then, {now} now"
            )
        return src

    def _memory_need(self, kind: str, device: int) -> int:
        return self._need(self._source(kind, device).nbytes)

    def _need(self, src_bytes: int) -> int:
        """memory_bytes for images of `src_bytes` bytes."""
        raise NotImplementedError

    def _prepare(
        self, kind: str, device: int, out_hw: tuple[int, int]
    ) -> tuple[Any, Any, int, Any]:
        src = self._source(kind, device)
        out_shape = self.shape[:-2] + out_hw
        # The output in the input's own library: CuPy in, CuPy out (torch otherwise).
        library = "cupy" if type(self.images).__module__.startswith("cupy") else "torch"
        out, out_ptr = zeros(out_shape, src.dtype, kind, device, library)
        return src, (out, out_ptr), 0 if src.dtype == "uint8" else 1, kind

    def _wrap(self, out: Any) -> Any:
        """The output in the input's own library (torch in, torch out)."""
        if type(self.images).__module__.startswith("torch") and isinstance(out, np.ndarray):
            import torch

            return torch.from_numpy(out)
        return out

    @property
    def planes(self) -> int:
        return int(np.prod(self.shape[:-2]))


class GaussianBlur(_ImageTask):
    """Gaussian blur of every image (each channel separately) with standard deviation
    `sigma` pixels: scipy.ndimage.gaussian_filter's kernel (radius truncate * sigma) and
    its default "reflect" borders. uint8 or float32 images shaped (N, H, W) or
    (N, C, H, W); the result is a new array of the same dtype, shape and device (float32
    to within 1e-5 of scipy, uint8 within 1 level)."""

    def __init__(self, images: Any, sigma: float, *, truncate: float = 4.0) -> None:
        super().__init__(images)
        self.sigma = check_float(sigma, "sigma")
        if self.sigma <= 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma}")
        self.truncate = check_float(truncate, "truncate")
        if self.truncate <= 0:
            raise ValueError(f"truncate must be > 0, got {self.truncate}")
        self.radius = int(self.truncate * self.sigma + 0.5)
        if self.radius > 10_000:
            raise ValueError(
                f"sigma * truncate gives a radius of {self.radius} pixels; at most 10000"
            )

    def _need(self, src_bytes: int) -> int:
        # The images and their blur (same dtype), the float32 pass between the two
        # filters, and the taps.
        return 2 * src_bytes + 4 * math.prod(self.shape) + 4 * (2 * self.radius + 1)

    def _work(self) -> tuple[int, int]:
        return 2, self.planes * -(-self.shape[-2] // _ROWS_PER_ITEM)  # rows, then columns

    def _build(self, kind: str, device: int) -> BoundTask:
        h, w = self.shape[-2:]
        src, (out, out_ptr), dtype, _ = self._prepare(kind, device, (h, w))
        x = np.arange(-self.radius, self.radius + 1, dtype=np.float64)
        taps = np.exp(-0.5 * (x / self.sigma) ** 2)
        weights, weights_ptr = upload((taps / taps.sum()).astype(np.float32), kind, device)
        tmp, tmp_ptr = zeros(self.shape, "float32", kind, device)
        core = gaussian_blur_task(
            self.planes,
            h,
            w,
            dtype,
            src.ptr,
            tmp_ptr,
            out_ptr,
            weights_ptr,
            self.radius,
            _ROWS_PER_ITEM,
        )
        core.memory_bytes = self._need(src.nbytes)
        return BoundTask(core, lambda: self._wrap(out), keep=(src, out, tmp, weights))

    def __repr__(self) -> str:
        return describe(self, shape=self.shape, sigma=self.sigma)


class Resize(_ImageTask):
    """Bilinear resize of every image to `size` ((H, W), or an int for both) with the
    semantics of torch.nn.functional.interpolate(mode="bilinear", align_corners=False,
    antialias=False). uint8 or float32 images shaped (N, H, W) or (N, C, H, W); the result
    is a new array of the same dtype and device (float32 to within 1e-5 of torch, uint8
    within 1 level)."""

    def __init__(self, images: Any, size: int | tuple[int, int]) -> None:
        super().__init__(images)
        if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
            size = (int(size), int(size))
        if not isinstance(size, (tuple, list)) or len(size) != 2:
            raise TypeError(f"size must be an int or an (H, W) pair, got {size!r}")
        self.size = (check_count(size[0], "size[0]"), check_count(size[1], "size[1]"))
        if math.prod(self.size) * self.planes > 2**40:
            raise ValueError(f"size {self.size} gives an output of more than 2**40 pixels")

    def _need(self, src_bytes: int) -> int:
        # the images and the resized ones (same dtype)
        return src_bytes + src_bytes // math.prod(self.shape) * self.planes * math.prod(self.size)

    def _work(self) -> tuple[int, int]:
        return 1, self.planes * -(-self.size[0] // _ROWS_PER_ITEM)

    def _build(self, kind: str, device: int) -> BoundTask:
        h, w = self.shape[-2:]
        src, (out, out_ptr), dtype, _ = self._prepare(kind, device, self.size)
        core = resize_task(self.planes, h, w, *self.size, dtype, src.ptr, out_ptr, _ROWS_PER_ITEM)
        core.memory_bytes = self._need(src.nbytes)
        return BoundTask(core, lambda: self._wrap(out), keep=(src, out))

    def __repr__(self) -> str:
        return describe(self, shape=self.shape, size=self.size)
