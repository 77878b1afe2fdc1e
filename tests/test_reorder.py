"""Cuthill-McKee ordering and the reordering of a matrix: the NumPy reference on the CPU.

The reference (``kernels/reorder_ref.py`` driven by ``solvers.cuthill_mckee``) is
checked against the textbook definition, written here one vertex at a time; the
GPU is checked against the reference in ``test_reorder_gpu.py``.
"""
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse.csgraph import reverse_cuthill_mckee

import solvers
from solvers import reorder
from solvers.cuthill_mckee import PERIPHERAL_SEARCHES, cuthill_mckee, degrees, segments
from solvers.gallery import poisson, power_law_laplacian, random_geometric_laplacian, stencil27
from solvers.kernels import reorder_ref
from solvers.reorder import Reordering, auto_reordering, canonical, choose_reordering, gather_sectors


def textbook_cuthill_mckee(A):
    """Cuthill-McKee as a queue: each vertex in turn appends its unvisited neighbours by (degree, index).

    Vertices without neighbours first; then each component from its unordered vertex
    of least (degree, index), moved by George and Liu's search to a vertex of least
    (degree, index) in the last level while that makes more levels.
    """
    A = sp.csr_matrix(A)
    n = A.shape[0]
    neighbours = [[int(w) for w in A.indices[A.indptr[v]:A.indptr[v + 1]] if w != v] for v in range(n)]
    degree = [len(x) for x in neighbours]
    key = lambda v: (degree[v], v)  # noqa: E731
    placed = [degree[v] == 0 for v in range(n)]
    order = [v for v in range(n) if placed[v]]

    def search(root):
        seen, queue, level = {root}, [root], {root: 0}
        for v in queue:
            for w in sorted({w for w in neighbours[v] if w not in seen and not placed[w]}, key=key):
                seen.add(w)
                queue.append(w)
                level[w] = level[v] + 1
        depth = max(level.values())
        return queue, depth + 1, min((w for w in queue if level[w] == depth), key=key)

    while len(order) < n:
        best = search(min((v for v in range(n) if not placed[v]), key=key))
        for _ in range(PERIPHERAL_SEARCHES):
            trial = search(best[2])
            if trial[1] <= best[1]:
                break
            best = trial
        for v in best[0]:
            placed[v] = True
        order += best[0]
    return np.array(order, dtype=np.int64)


def symmetric_pattern(n, pairs, diagonal):
    """A canonical symmetric CSR matrix with the given off-diagonal pairs and diagonal entries."""
    rows = [i for i, j in pairs] + [j for i, j in pairs] + list(diagonal)
    cols = [j for i, j in pairs] + [i for i, j in pairs] + list(diagonal)
    A = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n))
    A.sum_duplicates()
    return A


def shuffled(A, seed):
    p = np.random.default_rng(seed).permutation(A.shape[0])
    B = sp.csr_matrix(sp.csr_matrix(A)[p][:, p])
    B.sort_indices()
    return B


def path(n):
    return symmetric_pattern(n, [(i, i + 1) for i in range(n - 1)], range(n))


def star(n):
    return symmetric_pattern(n, [(0, i) for i in range(1, n)], range(n))


def gallery_graphs():
    return {"geometric 3000": random_geometric_laplacian(3000, seed=2),
            "power-law 2000": power_law_laplacian(2000, seed=3),
            "Poisson 30^2 shuffled": shuffled(poisson((30, 30)), 1),
            "27-point 10^3 shuffled": shuffled(stencil27((10, 10, 10)), 2)}


def small_graphs():
    """Graphs that reach every branch: components, empty rows, rows of the diagonal only, hubs, n of 0 and 1."""
    rng = np.random.default_rng(5)
    pairs = [tuple(int(v) for v in rng.integers(0, 60, 2)) for _ in range(70)]
    return {"empty": symmetric_pattern(0, [], []),
            "one vertex": symmetric_pattern(1, [], [0]),
            "one empty row": sp.csr_matrix((1, 1)),
            "diagonal only": symmetric_pattern(5, [], range(5)),
            "path 40": shuffled(path(40), 3),
            "star 200": shuffled(star(200), 4),  # a group of 199 at one level
            "random with components": symmetric_pattern(60, [(i, j) for i, j in pairs if i != j], range(0, 60, 2)),
            "two stars and isolated rows": symmetric_pattern(300, [(0, i) for i in range(1, 120)]
                                                             + [(150, i) for i in range(151, 290)], [7, 299])}


@pytest.mark.parametrize("name, A", list({**small_graphs(), **gallery_graphs()}.items()))
def test_reference_is_the_textbook_order(name, A):
    ordering = cuthill_mckee(A.indptr, A.indices)
    np.testing.assert_array_equal(ordering.order, textbook_cuthill_mckee(A), err_msg=name)
    assert ordering.order.dtype == np.int32
    assert (ordering.components >= 1) == (A.shape[0] >= 1)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n),
    st.lists(st.integers(0, n - 1), max_size=n))))
def test_reference_is_the_textbook_order_on_any_pattern(case):
    n, pairs, diagonal = case
    A = symmetric_pattern(n, [(i, j) for i, j in pairs if i != j], diagonal)
    ordering = cuthill_mckee(A.indptr, A.indices)
    np.testing.assert_array_equal(ordering.order, textbook_cuthill_mckee(A))


def test_components_and_isolated_rows_are_counted():
    A = small_graphs()["two stars and isolated rows"]
    ordering = cuthill_mckee(A.indptr, A.indices)
    isolated = np.flatnonzero(degrees(A.indptr, A.indices) == 0)
    assert ordering.components == isolated.size + 2
    np.testing.assert_array_equal(ordering.order[:isolated.size], isolated)  # first, in index order


def test_segments_list_their_positions_in_turn():
    group, positions = segments(np.array([10, 3, 50]), np.array([2, 3, 1]), np)
    np.testing.assert_array_equal(group, [0, 0, 1, 1, 1, 2])
    np.testing.assert_array_equal(positions, [10, 11, 3, 4, 5, 50])


def test_degrees_leave_the_diagonal_out():
    A = symmetric_pattern(4, [(0, 1), (0, 2), (1, 2)], [0, 3])
    np.testing.assert_array_equal(degrees(A.indptr, A.indices), [2, 2, 2, 0])


def bandwidth_and_profile(A, perm):
    B = sp.coo_matrix(sp.csr_matrix(A)[perm][:, perm])
    reach = np.zeros(A.shape[0], dtype=np.int64)
    np.maximum.at(reach, B.row, B.row - B.col)
    return int(np.abs(B.row - B.col).max()), int(reach.sum())


@pytest.mark.parametrize("name, A", list(gallery_graphs().items()))
def test_reverse_order_is_as_narrow_as_scipys(name, A):
    """Bandwidth and profile within 10% of SciPy's reverse Cuthill-McKee (it starts at a least degree
    vertex without the search and breaks ties otherwise)."""
    ours = cuthill_mckee(A.indptr, A.indices).order[::-1]
    scipys = reverse_cuthill_mckee(A, symmetric_mode=True)
    given = bandwidth_and_profile(A, np.arange(A.shape[0]))
    mine, theirs = bandwidth_and_profile(A, ours), bandwidth_and_profile(A, scipys)
    assert mine[0] <= 1.1 * theirs[0] and mine[1] <= 1.1 * theirs[1], (name, mine, theirs)
    if "power-law" not in name:  # a hub spans the matrix in any order
        assert mine[0] < given[0] / 3, (name, mine, given)


def test_limits_give_up_as_they_say():
    A = shuffled(path(100), 1)
    full = cuthill_mckee(A.indptr, A.indices)
    assert full.passes == 2 and full.levels == 200  # from an end of the path: 100 levels, again from the other
    assert cuthill_mckee(A.indptr, A.indices, max_levels=199) is None
    assert cuthill_mckee(A.indptr, A.indices, max_passes=1) is None
    again = cuthill_mckee(A.indptr, A.indices, max_levels=200, max_passes=2)
    np.testing.assert_array_equal(again.order, full.order)


@pytest.mark.parametrize("name, A", list({**small_graphs(), **gallery_graphs()}.items()))
def test_permuted_rows_are_scipys_permuted_matrix(name, A):
    A = sp.csr_matrix(A)
    A.data = np.arange(1.0, A.nnz + 1)  # every entry told apart
    perm = np.random.default_rng(7).permutation(A.shape[0])
    inverse = np.argsort(perm)
    indptr, indices, source = reorder_ref.permute_rows(perm, inverse, A.indptr, A.indices)
    expected = sp.csr_matrix(A[perm][:, perm])
    expected.sort_indices()
    np.testing.assert_array_equal(indptr, expected.indptr)
    np.testing.assert_array_equal(indices, expected.indices)
    np.testing.assert_array_equal(A.data[source], expected.data)


def test_host_reordering_is_scipys_and_undoes_itself():
    A = random_geometric_laplacian(2000, seed=1)
    order, note = choose_reordering(A, "rcm", "cpu")
    assert note == "rcm" and order.levels is None
    np.testing.assert_array_equal(order.perm, reverse_cuthill_mckee(A, symmetric_mode=True))
    v = np.random.default_rng(2).standard_normal((A.shape[0], 3))
    np.testing.assert_array_equal(order.backward(order.forward(v)), v)
    B = order.matrix(A)
    np.testing.assert_allclose(B @ order.forward(v), order.forward(A @ v), rtol=1e-13, atol=1e-13)
    assert choose_reordering(A, "auto", "cpu") == (None, "none (auto reorders on the GPU only)")


def test_neighbours_renumbering_is_the_formats_order_and_undoes_itself(monkeypatch):
    from solvers.formats.sell import SELL
    A = random_geometric_laplacian(20000, seed=1)
    order, note = choose_reordering(A, "neighbours", "cpu")
    assert note == "neighbours" and order.name == "neighbours" and order.seconds > 0
    monkeypatch.setattr(SELL, "NEIGHBOUR_PASSES", reorder.NEIGHBOUR_PASSES)
    layout = SELL(A.indptr.astype(np.int32), A.indices.astype(np.int32), np, lanes=1, row_order="neighbours")
    np.testing.assert_array_equal(order.perm, layout.slice_rows[layout.slice_rows >= 0])  # the rows as laid out
    B = order.matrix(A)
    assert gather_sectors(B.indptr, B.indices) < 0.5 * gather_sectors(A.indptr, A.indices)
    v = np.random.default_rng(2).standard_normal(A.shape[0])
    np.testing.assert_array_equal(order.backward(order.forward(v)), v)
    np.testing.assert_allclose(B @ order.forward(v), order.forward(A @ v), rtol=1e-13, atol=1e-13)
    b = A @ np.ones(A.shape[0])
    solver = solvers.PCG(A, device="cpu", reorder="neighbours", rtol=1e-10)
    assert solver.reordering == "neighbours"
    np.testing.assert_allclose(solver.solve(b).x, 1.0, rtol=1e-7)
    with pytest.raises(solvers.InputError, match="needs an explicit sparse matrix"):
        choose_reordering(A.toarray()[:50, :50], "neighbours", "cpu")
    with pytest.raises(solvers.InputError, match="needs a square matrix"):
        choose_reordering(sp.csr_matrix(np.ones((3, 4))), "neighbours", "cpu")


def test_sectors_of_a_reordering_are_counted_without_forming_it():
    A = random_geometric_laplacian(3000, seed=6)
    order = Reordering(cuthill_mckee(A.indptr, A.indices).order[::-1], "rcm")
    B = order.matrix(A)
    assert gather_sectors(A.indptr, A.indices, reordering=order) == gather_sectors(B.indptr, B.indices)
    assert gather_sectors(B.indptr, B.indices) < 0.5 * gather_sectors(A.indptr, A.indices)


def test_canonical_sums_duplicates_without_touching_the_given_matrix():
    A = sp.csr_matrix((np.ones(3), np.array([1, 0, 1]), np.array([0, 3, 3])), shape=(2, 2))
    B = canonical(A)
    assert B.has_canonical_format and B.nnz == 2 and A.nnz == 3
    assert canonical(B) is not None and canonical(B).nnz == 2


def test_auto_plans_for_a_scattered_graph_and_says_why():
    """The decisions of auto, made on the host with the reference (the GPU makes the same ones)."""
    A = canonical(random_geometric_laplacian(200_000, seed=3))
    plan, note = auto_reordering(A, 2**20)  # an iteration's vectors (9.6 MB) gathered from memory
    assert note == plan.note == ("neighbours after 1,180 iterations as numbered (0.94 sectors a nonzero; "
                                 "predicted to cost 8.1 ms and save 6.9 us an iteration)")
    assert (plan.iterations - 1) * plan.saving < plan.cost <= plan.iterations * plan.saving
    cached, _ = auto_reordering(A, 60 * 2**20)  # from the cache: a sector saved is worth less
    assert cached.cost == plan.cost and cached.iterations > 2 * plan.iterations
    order, note = plan.order()
    assert note == "neighbours after 1,180 iterations (0.94 -> 0.34 sectors a nonzero)"
    np.testing.assert_array_equal(order.perm, choose_reordering(A, "neighbours", "cpu")[0].perm)
    assert auto_reordering(canonical(sp.csr_matrix(poisson((60, 60)))), 0)[1].startswith("none (local reads")
    hub, note = auto_reordering(canonical(power_law_laplacian(20000, seed=1)), 0)
    assert hub is None and "stays scattered in any order" in note


def test_a_plan_falls_due_after_its_iterations():
    plan, _ = auto_reordering(canonical(random_geometric_laplacian(20000, seed=4)), 0)
    assert not plan.ran(plan.iterations - 1) and plan.left == 1
    assert plan.ran(5) and plan.left == 0 and plan.ran(0)


def test_a_plan_pays_within_a_solve_with_as_many_iterations_again_to_go():
    plan, _ = auto_reordering(canonical(random_geometric_laplacian(20000, seed=4)), 0)
    plan.iterations = 50
    # a tenth an iteration: 1e-2 -> 1e-6 is 40 more at the rate from 1 to 1e-2 in 20
    assert not plan.pays_within(1.0, 1e-2, 20, 1e-6)
    assert plan.pays_within(1.0, 1e-2, 20, 1e-8)  # 60 more
    assert plan.pays_within(1.0, 1.0, 20, 1e-8) and plan.pays_within(1.0, 2.0, 20, 1e-8)  # no progress
    assert not plan.pays_within(1.0, 1e-9, 20, 1e-8)  # converged


def test_a_plan_gives_up_where_the_ordering_disappoints(monkeypatch):
    """Permuting A dearer than the sectors the order saves (0.91 -> 0.33 a nonzero) over another pay-off
    count: the numbering stays."""
    A = canonical(random_geometric_laplacian(20000, seed=4))
    plan, _ = auto_reordering(A, 0)
    per_iteration = reorder.SECONDS_PER_SECTOR_FROM_MEMORY * plan.iterations
    monkeypatch.setattr(reorder, "GPU_SECONDS_PER_NONZERO", 0.5 * per_iteration)
    assert plan.order()[0] is not None
    monkeypatch.setattr(reorder, "GPU_SECONDS_PER_NONZERO", 0.7 * per_iteration)
    order, note = plan.order()
    assert order is None and note.startswith("none (the neighbours' order found little locality: 0.91 -> 0.33")


def test_kernels_compile(tmp_path):
    from test_kernels_compile import NVCC, compile_ok
    if NVCC is None:
        pytest.skip("nvcc (CUDA toolkit) not installed")
    from solvers import kernels
    from solvers.cuthill_mckee import program
    compile_ok(kernels.program(**program()), tmp_path)


def planned(A, iterations, **options):
    """A CPU solver with auto's plan for ``A`` falling due after ``iterations`` (auto plans on the GPU only)."""
    solver = solvers.PCG(A, device="cpu", reorder="none", **options)
    plan, _ = auto_reordering(canonical(A), 0)
    plan.iterations = plan.left = iterations
    solver._plan, solver.reordering = plan, plan.note
    return solver


def test_a_plan_due_mid_solve_reorders_there_and_the_solve_goes_on():
    A = random_geometric_laplacian(20000, seed=4)
    b = np.random.default_rng(1).standard_normal(A.shape[0])
    plain = solvers.PCG(A, device="cpu", rtol=1e-10, reorder="none", record_history=True).solve(b)
    seen = []
    solver = planned(A, 30, rtol=1e-10, record_history=True)
    res = solver.solve(b, callback=lambda xk: seen.append(np.linalg.norm(b - A @ xk)))
    assert solver.reordering == "neighbours after 30 iterations (0.91 -> 0.33 sectors a nonzero)"
    assert solver._plan is None
    assert res.converged and res.true_residual_norm <= 1e-10 * np.linalg.norm(b)
    np.testing.assert_allclose(res.x, plain.x, rtol=1e-7, atol=1e-9 * np.abs(plain.x).max())
    # restarted at iteration 30: the count, history and callbacks run on across the restart
    assert plain.iterations <= res.iterations <= plain.iterations + 10
    assert len(res.history) == res.iterations + 1 and len(seen) == res.iterations
    np.testing.assert_allclose(res.history[:31], plain.history[:31])
    np.testing.assert_allclose(seen[-1], np.linalg.norm(b - A @ res.x))  # the caller's numbering throughout
    again = solver.solve(b)  # reordered from the start now
    assert again.iterations <= plain.iterations + 2 and solver.reorder_time > 0


def test_a_plan_counts_iterations_over_solves():
    A = random_geometric_laplacian(20000, seed=4)
    b = np.random.default_rng(2).standard_normal(A.shape[0])
    solver = planned(A, 100, rtol=1e-6)
    first = solver.solve(b)
    assert first.converged and solver._plan.left == 100 - first.iterations and solver._order is None
    solver.solve(b, maxiter=100 - first.iterations)  # stops at its own limit, exactly when the plan falls due
    assert solver._plan.left == 0 and solver._order is None
    solver.update_values(2 * A)  # the plan reorders the new values
    third = solver.solve(b)  # reordered before it starts
    assert solver._order is not None and third.converged and abs(third.iterations - first.iterations) <= 1
    np.testing.assert_allclose(third.x, first.x / 2, rtol=1e-4, atol=1e-6 * np.abs(first.x).max())


def test_a_disappointing_plan_keeps_the_numbering_and_the_solve(monkeypatch):
    A = random_geometric_laplacian(20000, seed=4)
    b = np.random.default_rng(3).standard_normal(A.shape[0])
    solver = planned(A, 20, rtol=1e-9)
    monkeypatch.setattr(reorder, "GPU_SECONDS_PER_NONZERO", 1.0)  # permuting A never pays
    res = solver.solve(b)
    assert res.converged and solver._order is None and solver._plan is None
    assert solver.reordering.startswith("none (the neighbours' order found little locality")


def test_a_plan_due_near_the_end_of_a_solve_waits_for_the_next():
    A = random_geometric_laplacian(20000, seed=4)
    b = np.random.default_rng(1).standard_normal(A.shape[0])
    plain = solvers.PCG(A, device="cpu", rtol=1e-10, reorder="none").solve(b)
    solver = planned(A, plain.iterations - 5, rtol=1e-10)
    note = solver.reordering
    res = solver.solve(b)  # due five iterations before the end: not worth reordering in this solve
    assert res.converged and solver.reordering == note and solver._plan.left == 0 and solver._order is None
    assert plain.iterations <= res.iterations <= plain.iterations + 5
    again = solver.solve(b)
    assert again.converged and solver._order is not None and solver.reordering.startswith("neighbours after")
