"""Cuthill-McKee and the permutation of a matrix on the GPU: the NumPy reference's results, entry for entry."""
import numpy as np
import pytest
import scipy.sparse as sp
from test_reorder import gallery_graphs, path, shuffled, small_graphs, star

import solvers
from solvers.cuthill_mckee import SORT_ON_DEVICE, cuthill_mckee
from solvers.gallery import poisson, power_law_laplacian, random_geometric_laplacian
from solvers.pcg.solver import FORMAT_NUMBERING
from solvers.kernels import reorder_ref
from solvers.reorder import Reordering, auto_reordering, canonical, choose_reordering

pytestmark = pytest.mark.gpu


def device_graphs():
    """The CPU tests' graphs, and ones with many levels or groups too large for one thread."""
    return {**small_graphs(), **gallery_graphs(), "path 3000": shuffled(path(3000), 5),
            "star 5000": shuffled(star(5000), 6), "power-law 20000": power_law_laplacian(20000, seed=1),
            "geometric 20000": random_geometric_laplacian(20000, seed=4)}


@pytest.mark.parametrize("name", list(device_graphs()))
def test_device_order_is_the_reference(cupy, name):
    A = device_graphs()[name]
    expected = cuthill_mckee(A.indptr, A.indices)
    got = cuthill_mckee(cupy.asarray(A.indptr), cupy.asarray(A.indices))
    np.testing.assert_array_equal(got.order.get(), expected.order, err_msg=name)
    assert (got.levels, got.passes, got.components) == (expected.levels, expected.passes, expected.components)


def test_device_order_gives_up_where_the_reference_does(cupy):
    A = shuffled(path(100), 1)
    indptr, indices = cupy.asarray(A.indptr), cupy.asarray(A.indices)
    assert cuthill_mckee(indptr, indices, max_levels=199) is None
    assert cuthill_mckee(indptr, indices, max_passes=1) is None
    np.testing.assert_array_equal(cuthill_mckee(indptr, indices, max_levels=200).order.get(),
                                  cuthill_mckee(A.indptr, A.indices).order)


def test_device_order_is_repeatable(cupy):
    A = random_geometric_laplacian(200_000, seed=9)
    indptr, indices = cupy.asarray(A.indptr), cupy.asarray(A.indices)
    first = cuthill_mckee(indptr, indices).order.get()
    assert np.array_equal(np.sort(first), np.arange(A.shape[0]))
    for _ in range(2):
        np.testing.assert_array_equal(cuthill_mckee(indptr, indices).order.get(), first)
    np.testing.assert_array_equal(first, cuthill_mckee(A.indptr, A.indices).order)


@pytest.mark.parametrize("name", ["power-law 20000", "star 5000", "geometric 20000", "random with components",
                                  "empty", "one empty row"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_device_permutation_is_the_reference(cupy, name, dtype):
    import cupyx.scipy.sparse as csp
    A = sp.csr_matrix(device_graphs()[name], dtype=dtype)
    A.data = np.arange(1, A.nnz + 1, dtype=dtype)  # every entry told apart
    perm = np.random.default_rng(3).permutation(A.shape[0])
    indptr, indices, source = reorder_ref.permute_rows(perm, np.argsort(perm), A.indptr, A.indices)
    B = Reordering(cupy.asarray(perm), "test").matrix(csp.csr_matrix(A))
    assert B.has_canonical_format and B.dtype == dtype
    np.testing.assert_array_equal(B.indptr.get(), indptr)
    np.testing.assert_array_equal(B.indices.get(), indices)
    np.testing.assert_array_equal(B.data.get(), A.data[source])
    if name == "power-law 20000":
        assert np.diff(indptr).max() > SORT_ON_DEVICE  # the rows the host sorts


def test_canonical_checks_and_sums_a_device_matrix_by_entries(cupy):
    import cupyx.scipy.sparse as csp
    A = power_law_laplacian(5000, seed=2)
    given = csp.csr_matrix(A)
    assert canonical(given) is given and given.has_canonical_format
    start = int(A.indptr[np.argmax(np.diff(A.indptr))])  # the hub row, its first entry twice
    indices = A.indices.copy()
    indices[start + 1] = indices[start]
    repeated = csp.csr_matrix((cupy.asarray(A.data), cupy.asarray(indices), cupy.asarray(A.indptr)), shape=A.shape)
    B = canonical(repeated)
    expected = sp.csr_matrix((A.data.copy(), indices.copy(), A.indptr.copy()), shape=A.shape)
    expected.sum_duplicates()  # in place: on copies, so that A keeps its own
    assert B is not repeated and B.has_canonical_format and B.nnz == A.nnz - 1 == expected.nnz
    np.testing.assert_array_equal(B.indices.get(), expected.indices)
    np.testing.assert_allclose(B.data.get(), expected.data)


def test_rcm_on_the_gpu_is_our_order_reversed(cupy):
    import cupyx.scipy.sparse as csp
    A = random_geometric_laplacian(5000, seed=2)
    expected = cuthill_mckee(A.indptr, A.indices).order[::-1]
    # the last entry twice (the same pattern once summed)
    with_duplicates = csp.csr_matrix((cupy.ones(A.nnz + 1), cupy.asarray(np.append(A.indices, A.indices[-1])),
                                      cupy.asarray(np.append(A.indptr[:-1], A.nnz + 1))), shape=A.shape)
    for given in (A, csp.csr_matrix(A), with_duplicates):
        order, note = choose_reordering(given, "rcm", "gpu")
        assert note == "rcm" and order.seconds > 0 and order.levels > 0 and order.passes >= 2
        np.testing.assert_array_equal(order.perm.get(), expected)
    v = cupy.random.default_rng(1).standard_normal((A.shape[0], 2))
    assert cupy.array_equal(order.backward(order.forward(v)), v)
    np.testing.assert_array_equal(order.forward(v.get()), order.forward(v).get())  # host vectors too


def test_neighbours_renumbering_on_the_gpu_is_the_hosts(cupy):
    import cupyx.scipy.sparse as csp
    A = random_geometric_laplacian(30000, seed=2)
    host, _ = choose_reordering(A, "neighbours", "cpu")
    for given in (A, csp.csr_matrix(A)):
        order, note = choose_reordering(given, "neighbours", "gpu")
        assert note == "neighbours" and order.seconds > 0
        np.testing.assert_array_equal(order.perm.get(), host.perm)


def expander(n, seed):
    """Random graph, four random neighbours a vertex: little locality for any numbering."""
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), 4)
    M = sp.coo_matrix((np.ones(rows.size), (rows, rng.integers(0, n, rows.size))), shape=(n, n))
    return sp.csr_matrix(M + M.T + 20 * sp.eye(n))


@pytest.mark.parametrize("make", [lambda: random_geometric_laplacian(50_000, seed=1),
                                  lambda: power_law_laplacian(20000, seed=1), lambda: expander(20000, 3),
                                  lambda: shuffled(path(3000), 5)])
def test_auto_decides_on_the_gpu_as_the_reference_does(cupy, make):
    import cupyx.scipy.sparse as csp
    A = canonical(make())
    host_plan, host_note = auto_reordering(A, 0)
    device_plan, device_note = auto_reordering(canonical(csp.csr_matrix(A)), 0)
    assert device_note == host_note
    assert (device_plan is None) == (host_plan is None)
    if host_plan is not None:
        (host_order, host_note), (device_order, device_note) = host_plan.order(), device_plan.order()
        assert device_note == host_note and (device_order is None) == (host_order is None)
        if host_order is not None:
            np.testing.assert_array_equal(device_order.perm.get(), host_order.perm)


def test_auto_numbers_a_scattered_graph_as_sell_lays_it_out_out_of_sight(cupy):
    A = random_geometric_laplacian(1_500_000, seed=1)  # 22M nonzeros, numbered at random
    n = A.shape[0]
    b = np.random.default_rng(4).standard_normal(n)
    plain = solvers.PCG(A, device="gpu", rtol=1e-9, reorder="none")
    assert plain._impl.numbering is None and plain.reordering == "none"
    expected = plain.solve(b)
    solver = solvers.PCG(A, device="gpu", rtol=1e-9)
    assert solver.reordering == FORMAT_NUMBERING and solver._plan is None and solver._order is None
    assert solver.reorder_time == 0
    assert "rows by neighbours" in solver.format and "numbered as laid out" in solver.format
    res = solver.solve(b)
    scale = float(np.abs(expected.x.get()).max())
    assert res.converged and abs(res.iterations - expected.iterations) <= max(2, expected.iterations // 50)
    np.testing.assert_allclose(res.x.get(), expected.x.get(), rtol=1e-6, atol=1e-8 * scale)
    assert res.true_residual_norm <= 1e-8 * np.linalg.norm(b)
    x0 = cupy.asarray(expected.x) * 0.5  # x0, as the caller numbers it
    again = solver.solve(b, x0=x0)
    assert again.iterations < res.iterations
    np.testing.assert_allclose(again.x.get(), expected.x.get(), rtol=1e-6, atol=1e-8 * scale)
    solver.update_values(2 * A)  # the new values laid out as the old ones
    np.testing.assert_allclose(solver.solve(b).x.get(), expected.x.get() / 2, rtol=1e-6, atol=1e-8 * scale)
    columns = solver.solve(np.stack([b, 2 * b], axis=1))  # k right-hand sides read A as numbered
    np.testing.assert_allclose(cupy.asnumpy(columns.x[:, 1]), expected.x.get(), rtol=1e-6, atol=1e-8 * scale)
    out = cupy.empty(n)
    solver.enqueue(cupy.asarray(2 * b), out)  # the caller's buffers, in the caller's numbering
    cupy.cuda.Device().synchronize()
    assert solver.enqueued_result()[0].name == "CONVERGED"
    np.testing.assert_allclose(out.get(), expected.x.get(), rtol=1e-6, atol=1e-8 * scale)


def test_callbacks_and_modes_see_the_callers_numbering(cupy):
    A = random_geometric_laplacian(60_000, seed=3)
    b = np.random.default_rng(5).standard_normal(A.shape[0])
    runs = {mode: solvers.PCG(A, device="gpu", rtol=1e-9, mode=mode, path="grid") for mode in ("eager", "graph",
                                                                                                 "while")}
    assert all(s.reordering == FORMAT_NUMBERING for s in runs.values())
    xs = {mode: s.solve(b).x for mode, s in runs.items()}
    assert all(cupy.array_equal(x, xs["while"]) for x in xs.values())
    seen = []
    called = runs["eager"].solve(b, maxiter=5, callback=lambda xk: seen.append(cupy.asarray(xk).copy()))
    assert len(seen) == 5 and cupy.array_equal(seen[-1], called.x)


def test_auto_defers_renumbering_a_scattered_stencil_until_it_pays(cupy):
    A = shuffled(poisson((120, 110, 110)), 3)  # 1.45M rows of 7 entries, numbered at random: ELL
    b = np.random.default_rng(4).standard_normal(A.shape[0])
    plain = solvers.PCG(A, device="gpu", rtol=1e-9, reorder="none").solve(b)
    solver = solvers.PCG(A, device="gpu", rtol=1e-9, record_history=True)
    plan = solver._plan
    assert solver.format.startswith("ell") and solver._impl.numbering is None
    assert solver.reordering == plan.note and solver.reordering.startswith("neighbours after ")
    assert solver.reorder_time == 0
    plan.iterations = plan.left = 40  # due inside the first solve, with more than 40 to go
    seen = []
    res = solver.solve(b, progress=lambda i, r: seen.append(i))
    assert solver.reordering.startswith(f"neighbours after {plan.iterations:,} iterations (")
    assert solver._order is not None and solver.reorder_time > 0
    scale = float(np.abs(plain.x.get()).max())
    assert res.converged and plain.iterations <= res.iterations <= plain.iterations + plain.iterations // 10
    assert len(res.history) == res.iterations + 1 and all(i <= res.iterations for i in seen)
    np.testing.assert_allclose(res.x.get(), plain.x.get(), rtol=1e-6, atol=1e-8 * scale)
    again = solver.solve(b)  # reordered from the start
    assert abs(again.iterations - plain.iterations) <= max(2, plain.iterations // 50)
    solver.update_values(2 * A)  # the new values are reordered as the old ones were
    np.testing.assert_allclose(solver.solve(b).x.get(), res.x.get() / 2, rtol=1e-6, atol=1e-8 * scale)


def test_auto_measures_the_reads_only_where_a_plan_could_be_kept(cupy, monkeypatch):
    from solvers.pcg import solver as solver_module
    measured = []
    monkeypatch.setattr(solver_module, "choose_reordering",
                        lambda *args: measured.append(args[1]) or choose_reordering(*args))
    graph = random_geometric_laplacian(50_000, seed=1)  # SELL numbers its rows as laid out
    assert solvers.PCG(graph, device="gpu", path="grid").reordering == FORMAT_NUMBERING and measured == []
    on_chip = solvers.PCG(poisson((100, 100)), device="gpu")  # on chip where the GPU has clusters
    if on_chip.path == "on-chip":
        assert on_chip.reordering.startswith("none (auto reorders the grid path") and measured == []
    measured.clear()
    stencil = solvers.PCG(shuffled(poisson((230, 220)), 2), device="gpu", path="grid")  # ELL, as numbered
    assert measured == ["auto"] and stencil.reordering.startswith("neighbours after ")
    given = solvers.PCG(cupy.asarray(poisson((30, 30)).toarray()), device="gpu", path="grid")
    assert given.reordering == "none (the matrix is on the GPU)" and measured == ["auto"]


def test_auto_plans_far_ahead_for_a_small_matrix_and_enqueue_gives_the_plan_up(cupy):
    A = shuffled(poisson((230, 220)), 2)  # 50,600 rows numbered at random: ELL, in the L2 cache
    solver = solvers.PCG(A, device="gpu", path="grid")
    assert solver.reordering.startswith("neighbours after ") and solver._plan.iterations > 5000
    b = cupy.asarray(A @ np.ones(A.shape[0]))
    out = cupy.empty_like(b)
    solver.enqueue(b, out)
    cupy.cuda.Device().synchronize()
    assert solver._plan is None and solver.reordering.startswith("none (auto's deferred reordering given up")
    assert solver.enqueued_result()[0].name == "CONVERGED"
    amg = solvers.PCG(random_geometric_laplacian(50_000, seed=1), device="gpu", preconditioner="amg")
    assert amg.reordering.startswith("none (auto reorders the grid path with Jacobi or no preconditioner")


def test_reordered_solves_give_the_same_bits_in_every_mode(cupy):
    A = random_geometric_laplacian(50_000, seed=1)
    b = np.random.default_rng(4).standard_normal(A.shape[0])
    xs = [solvers.PCG(A, device="gpu", rtol=1e-9, reorder="rcm", mode=mode, path="grid").solve(b).x
          for mode in ("eager", "graph", "while")]
    assert all(cupy.array_equal(x, xs[-1]) for x in xs)
