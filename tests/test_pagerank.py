import time

import numpy as np
import pytest

import freeride as fr
from freeride import _C


def random_graph(n, m, seed):
    rng = np.random.default_rng(seed)
    # The last tenth of the nodes have no out-links (dangling); node 0 has many.
    src = rng.integers(0, max(1, n - n // 10), m)
    dst = rng.integers(0, n, m)
    src[: n // 10] = 0
    order = np.argsort(src, kind="stable")
    src, dst = src[order], dst[order]
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr, dst.astype(np.int64)


def dense_pagerank(indptr, indices, iters, d):
    n = indptr.size - 1
    p = np.zeros((n, n))
    for u in range(n):
        outs = indices[indptr[u] : indptr[u + 1]]
        if outs.size == 0:
            p[:, u] = 1.0 / n
        for v in outs:
            p[v, u] += 1.0 / outs.size
    r = np.full(n, 1.0 / n)
    for _ in range(iters):
        r = (1 - d) / n + d * (p @ r)
    return r


@pytest.mark.parametrize("n, m, iters", [(1, 0, 3), (7, 20, 5), (300, 2000, 20), (1000, 500, 10)])
def test_matches_dense_power_iteration(harvester, n, m, iters):
    indptr, indices = random_graph(n, m, seed=n)
    assert (np.diff(indptr) == 0).any() or n < 10
    task = fr.tasks.PageRank(indptr, indices, iters=iters, nodes_per_item=64)
    ranks = harvester.submit(task).result(timeout=60)
    np.testing.assert_allclose(ranks, dense_pagerank(indptr, indices, iters, 0.85), atol=1e-12)
    assert ranks.sum() == pytest.approx(1.0, abs=1e-9)


def test_exactly_once_under_gate_flips(host):
    # A phase (~1.5 ms here with 4 workers) must outlast the 0.2 ms open windows, or
    # every phase can finish inside one and the task is never paused: with 5000 nodes
    # (~0.1 ms a phase) that happened once launches started without an executor hop.
    indptr, indices = random_graph(100000, 800000, seed=1)
    reference = host.submit(fr.tasks.PageRank(indptr, indices, iters=8, nodes_per_item=16))
    ref = reference.result(timeout=60)
    flipped = host.submit(fr.tasks.PageRank(indptr, indices, iters=8, nodes_per_item=16))
    while not flipped.done():
        host.gate.close(stream="host")
        time.sleep(0.0002)  # both windows long enough for the executor to see them
        host.gate.open(stream="host")
        time.sleep(0.0002)
    np.testing.assert_allclose(flipped.result(), ref, rtol=1e-12)
    assert flipped.launches > 16  # it really was paused and resumed


def test_scipy_and_torch_inputs(host):
    sp = pytest.importorskip("scipy.sparse")
    torch = pytest.importorskip("torch")
    indptr, indices = random_graph(50, 300, seed=3)
    ref = dense_pagerank(indptr, indices, 20, 0.9)
    mat = sp.csr_matrix((np.ones(indices.size), indices, indptr), shape=(50, 50))
    np.testing.assert_allclose(
        host.submit(fr.tasks.PageRank(mat, damping=0.9)).result(), ref, atol=1e-12
    )
    out = host.submit(
        fr.tasks.PageRank(torch.from_numpy(indptr), torch.from_numpy(indices).int(), damping=0.9)
    ).result()
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-12)


@pytest.mark.parametrize(
    "indptr, indices, exc, match",
    [
        ([0, 1], [0], TypeError, "indptr must be a torch tensor or numpy array"),
        (np.array([0, 2, 1]), np.array([0, 1]), ValueError, "non-decreasing"),
        (np.array([1, 2]), np.array([0, 0]), ValueError, r"indptr\[0\] must be 0"),
        (np.array([0, 3]), np.array([0, 0]), ValueError, r"indptr\[-1\] \(3\) must equal"),
        (np.array([0, 1, 2]), np.array([0, 5]), ValueError, r"indices must be in \[0, 2\)"),
        (np.array([0, 1, 2]), np.array([0, -1]), ValueError, "indices must be in"),
        (np.array([0]), np.array([], np.int64), ValueError, "at least 2 entries"),
        (np.array([0.0, 1.0]), np.array([0]), TypeError, "indptr must have an integer dtype"),
        (np.zeros((2, 2), np.int64), np.array([0]), ValueError, "indptr must be 1-D"),
        # unsigned values past int64 would wrap to negative ones the caller never passed
        (
            np.array([0, 1], np.uint64),
            np.array([2**63 + 5], np.uint64),
            ValueError,
            r"indices must fit in int64 \(at most 9223372036854775807\), found 9223372036854775813",
        ),
        (
            np.array([0, 2**64 - 1], np.uint64),
            np.array([0], np.uint64),
            ValueError,
            "indptr must fit in int64",
        ),
    ],
)
def test_malformed_csr(indptr, indices, exc, match):
    with pytest.raises(exc, match=match):
        fr.tasks.PageRank(indptr, indices)


def test_sparse_tensors_are_refused_by_name():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="indptr must be a dense tensor; got layout torch.sparse"):
        fr.tasks.PageRank(torch.tensor([0, 1]).to_sparse(), torch.tensor([0]))
    with pytest.raises(TypeError, match="indices must be a dense tensor"):
        fr.tasks.PageRank(torch.tensor([0, 1]), torch.tensor([0]).to_sparse())


def test_unsigned_indices_within_int64_are_taken(host):
    task = fr.tasks.PageRank(np.array([0, 1, 2], np.uint64), np.array([1, 0], np.uint32))
    handle = host.submit(task)
    assert handle.wait(timeout=30)
    np.testing.assert_allclose(handle.result(), [0.5, 0.5])


def test_bad_parameters():
    indptr, indices = np.array([0, 1]), np.array([0])
    with pytest.raises(ValueError, match=r"damping must be in \[0, 1\]"):
        fr.tasks.PageRank(indptr, indices, damping=1.5)
    with pytest.raises(ValueError, match="iters must be >= 1"):
        fr.tasks.PageRank(indptr, indices, iters=0)
    with pytest.raises(TypeError, match="indices is required"):
        fr.tasks.PageRank(indptr)


def test_matches_networkx(host):
    nx = pytest.importorskip("networkx")
    pytest.importorskip("scipy")  # networkx's pagerank runs on scipy
    indptr, indices = random_graph(200, 1500, seed=7)
    g = nx.MultiDiGraph()  # parallel edges count, as they do here
    g.add_nodes_from(range(200))
    for u in range(200):
        for v in indices[indptr[u] : indptr[u + 1]]:
            g.add_edge(u, int(v))
    want = nx.pagerank(g, alpha=0.85, max_iter=1000, tol=1e-14)
    got = host.submit(fr.tasks.PageRank(indptr, indices, iters=200)).result()
    np.testing.assert_allclose(got, [want[i] for i in range(200)], atol=1e-6)


@pytest.mark.parametrize(("nodes", "edges"), [(1, 0), (1, 3), (5, 0), (50, 400), (1_000, 20_000)])
def test_csr_transpose_matches_a_stable_sort(nodes, edges):
    """The in-links PageRank pulls from (freeride._C.csr_transpose, a counting sort) are
    exactly what a stable sort of the destinations gives, with parallel edges, self-loops
    and nodes without links; a stable comparison sort of the 1.6M edges of a 200k-node
    graph took a quarter of a second of every submit (the H200 pipeline benchmark's
    PageRank never started in its 134 ms iterations)."""
    rng = np.random.default_rng(nodes + edges)
    counts = rng.multinomial(edges, np.ones(nodes) / nodes) if edges else np.zeros(nodes, int)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    indices = rng.integers(0, nodes, size=edges, dtype=np.int64)
    in_indptr, in_indices = _C.csr_transpose(indptr, indices)
    src = np.repeat(np.arange(nodes, dtype=np.int64), np.diff(indptr))
    assert np.array_equal(in_indices, src[np.argsort(indices, kind="stable")])
    expected_ptr = np.concatenate([[0], np.cumsum(np.bincount(indices, minlength=nodes))])
    assert np.array_equal(in_indptr, expected_ptr)


@pytest.mark.parametrize(
    ("indptr", "indices", "match"),
    [
        ([0, 2], [0, 5], r"indices must be in \[0, 1\)"),
        ([0, 2], [0, -1], r"indices must be in \[0, 1\)"),
        ([0, 3, 2], [0, 1], r"indptr\[1\] \(3\) exceeds the edge count 2"),
        ([0, 2, 1, 2], [0, 1], r"non-decreasing; indptr\[2\] < indptr\[1\]"),
        ([1, 2], [0, 0], "indptr must run from 0 to the edge count 2"),
        ([0, 1], [0, 0], "indptr must run from 0 to the edge count 2"),
        ([0], [], "at least 2 entries"),
    ],
)
def test_csr_transpose_refuses_a_malformed_graph(indptr, indices, match):
    """Out-of-range destinations or offsets get an exception naming them, never a read
    past the arrays (PageRank validates first; the function checks again)."""
    with pytest.raises(ValueError, match=match):
        _C.csr_transpose(np.array(indptr, np.int64), np.array(indices, np.int64))


@pytest.mark.gpu
@pytest.mark.parametrize("n, m, iters", [(7, 20, 5), (300, 2000, 20), (20_000, 200_000, 30)])
def test_device_phases_match_the_host_in_fewer_launches_than_phases(monkeypatch, n, m, iters):
    """FREERIDE_DEVICE_PHASES=1 (csrc/device_phases.hpp): every phase of a PageRank from
    one launch (its kernel of device phases takes both kinds of phase). The pull reads the
    contributions and dangling mass other blocks wrote in the phase before, and the next
    iteration the ranks: the result matches the host backend's, in fewer launches than
    phases."""
    torch = pytest.importorskip("torch")
    indptr, indices = random_graph(n, m, seed=n)
    with fr.Harvester("cpu", workers=4) as h:
        h.gate.open()
        ref = h.submit(fr.tasks.PageRank(indptr, indices, iters=iters, nodes_per_item=16)).result(
            60
        )
    monkeypatch.setenv("FREERIDE_DEVICE_PHASES", "1")
    with fr.Harvester("cuda:0") as h:
        h.gate.open()
        handle = h.submit(fr.tasks.PageRank(indptr, indices, iters=iters, nodes_per_item=16))
        ranks = handle.result(60)
        torch.cuda.synchronize()
    print(f"{n} nodes: {2 * iters} phases in {handle.launches} launches")
    np.testing.assert_allclose(ranks, ref, rtol=1e-10, atol=1e-14)
    assert handle.launches < 2 * iters
