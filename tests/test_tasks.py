import numpy as np
import pytest

import freeride as fr


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, chunk", [(1, None), (1000, 7), (100_003, None), (4096, 4096)])
def test_saxpy_matches_numpy(host, dtype, n, chunk):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(dtype)
    y = rng.standard_normal(n).astype(dtype)
    expected = y + dtype(1.75) * x
    t = host.submit(fr.tasks.Saxpy(1.75, x, y, chunk=chunk))
    out = t.result(timeout=30)
    assert out is y
    np.testing.assert_allclose(y, expected, rtol=1e-6 if dtype == np.float32 else 1e-12)


def test_saxpy_on_torch_tensors_survives_pauses(host):
    torch = pytest.importorskip("torch")
    x = torch.randn(1_000_000, dtype=torch.float64)
    y = torch.randn(1_000_000, dtype=torch.float64)
    expected = y + 0.5 * x
    t = host.submit(fr.tasks.Saxpy(0.5, x, y, chunk=1000))
    for _ in range(20):  # flip the gate while it runs: no chunk may be applied twice
        host.gate.close()
        host.gate.open()
    t.result(timeout=60)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-12)


def test_spin_runs_every_item(host):
    t = host.submit(fr.tasks.Spin(200, 10_000, phases=3))
    assert t.result(timeout=30) is None
    assert t.items_done == 600 and t.state == "done"


def test_task_reprs():
    assert "Spin(items=3" in repr(fr.tasks.Spin(3, 10))
    assert "ItemCounter(items=4" in repr(fr.tasks.ItemCounter(4))
