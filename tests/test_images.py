import sys

import numpy as np
import pytest

import freeride as fr

ndimage = pytest.importorskip("scipy.ndimage")


def images(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == np.uint8:
        return rng.integers(0, 256, shape, dtype=np.uint8)
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("shape", [(3, 17, 29), (2, 3, 40, 31), (1, 1, 1)])
@pytest.mark.parametrize("sigma", [0.7, 2.0, 5.5])
def test_gaussian_blur_matches_scipy(host, shape, sigma):
    for dtype in (np.float32, np.uint8):
        img = images(shape, dtype)
        out = host.submit(fr.tasks.GaussianBlur(img, sigma)).result(timeout=60)
        axes = (0,) * (len(shape) - 2) + (sigma, sigma)
        want = ndimage.gaussian_filter(img.astype(np.float64), axes, mode="reflect")
        assert out.shape == img.shape and out.dtype == img.dtype
        if dtype == np.float32:
            np.testing.assert_allclose(out, want, atol=1e-5)
        else:
            assert np.abs(out.astype(np.int32) - np.round(want)).max() <= 1


@pytest.mark.parametrize("size", [(8, 8), (33, 19), (1, 1), (64, 70)])
def test_resize_matches_torch(host, size):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    for dtype in (np.float32, np.uint8):
        img = images((2, 3, 24, 20), dtype, seed=size[0])
        out = host.submit(fr.tasks.Resize(img, size)).result(timeout=60)
        want = F.interpolate(
            torch.from_numpy(img.astype(np.float32)),
            size=size,
            mode="bilinear",
            align_corners=False,
        ).numpy()
        assert out.shape == (2, 3, *size) and out.dtype == img.dtype
        if dtype == np.float32:
            np.testing.assert_allclose(out, want, atol=1e-5)
        else:
            assert np.abs(out.astype(np.int32) - np.round(want)).max() <= 1


def test_torch_in_torch_out_and_3d(host):
    torch = pytest.importorskip("torch")
    img = torch.rand(4, 10, 12)
    out = host.submit(fr.tasks.Resize(img, 5)).result()
    assert isinstance(out, torch.Tensor) and out.shape == (4, 5, 5)
    want = torch.nn.functional.interpolate(
        img[:, None], size=(5, 5), mode="bilinear", align_corners=False
    )[:, 0]
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)


def test_blur_survives_pauses(host):
    img = images((4, 3, 64, 64), np.float32)
    ref = host.submit(fr.tasks.GaussianBlur(img, 1.5)).result()
    t = host.submit(fr.tasks.GaussianBlur(img, 1.5))
    while not t.done():
        host.gate.close(stream="host")
        host.gate.open(stream="host")
    np.testing.assert_array_equal(t.result(), ref)


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (
            lambda: fr.tasks.GaussianBlur(np.zeros((4, 4), np.float32), 1.0),
            ValueError,
            r"images must be shaped \(N, H, W\)",
        ),
        (
            lambda: fr.tasks.GaussianBlur(np.zeros((1, 0, 4), np.float32), 1.0),
            ValueError,
            "must not be empty",
        ),
        (
            lambda: fr.tasks.GaussianBlur(np.zeros((1, 4, 4), np.float32), 0.0),
            ValueError,
            "sigma must be > 0",
        ),
        (
            lambda: fr.tasks.GaussianBlur(np.zeros((1, 4, 4), np.float32), -1),
            ValueError,
            "sigma must be > 0",
        ),
        (lambda: fr.tasks.GaussianBlur([[1.0]], 1.0), TypeError, "images must be"),
        (
            lambda: fr.tasks.Resize(np.zeros((1, 4, 4), np.float32), (0, 3)),
            ValueError,
            r"size\[0\] must be >= 1",
        ),
        (
            lambda: fr.tasks.Resize(np.zeros((1, 4, 4), np.float32), (2, 3, 4)),
            TypeError,
            "size must be an int or an",
        ),
    ],
)
def test_bad_image_arguments(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_bad_image_dtype_and_layout(host):
    with pytest.raises(TypeError, match="images must have dtype uint8 or float32"):
        host.submit(fr.tasks.GaussianBlur(np.zeros((1, 4, 4), np.float64), 1.0))
    with pytest.raises(ValueError, match="images must be contiguous"):
        host.submit(fr.tasks.Resize(np.zeros((1, 4, 8), np.float32)[:, :, ::2], 2))
    assert host.submit(fr.tasks.Spin(2, 10)).wait(10)


def test_an_output_on_a_gpu_follows_a_cupy_input(monkeypatch):
    """On a GPU, an image task's output is made in its input's library: CuPy in, CuPy out,
    even where torch is installed too (which buffers on a GPU use otherwise). A stand-in
    CuPy module answers here, as there is no GPU."""
    import contextlib
    import types

    from freeride.tasks import _base

    made = []

    class _Buffer:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, dtype
            self.data = types.SimpleNamespace(ptr=0xC0DE)

    def cupy_zeros(shape, dtype):
        made.append((shape, dtype))
        return _Buffer(shape, dtype)

    fake = types.SimpleNamespace(
        zeros=cupy_zeros,
        cuda=types.SimpleNamespace(Device=lambda index: contextlib.nullcontext()),
    )
    monkeypatch.setitem(sys.modules, "cupy", fake)
    arr, ptr = _base.zeros((2, 3), "float32", "cuda", 0, library="cupy")
    assert isinstance(arr, _Buffer) and ptr == 0xC0DE and made == [((2, 3), "float32")]
