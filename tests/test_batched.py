"""Batched PCG: many systems at once, each as if solved alone; failures stay with their system."""
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import solvers
from solvers.errors import InputError
from solvers.gallery import poisson, variable_diffusion
from solvers.pcg.result import Reason


def diffusion_batch(count, shape=(8, 8), seed=0):
    rng = np.random.default_rng(seed)
    return [variable_diffusion(np.exp(rng.normal(size=shape))) for _ in range(count)]


def alone(A, b, **options):
    return solvers.PCG(A, device="cpu", **options).solve(b)


@pytest.mark.parametrize("preconditioner", ["jacobi", "none"])
def test_each_system_as_if_solved_alone(preconditioner):
    mats = diffusion_batch(6)
    rng = np.random.default_rng(1)
    b = rng.standard_normal((6, 64))
    res = solvers.BatchedPCG(mats, preconditioner=preconditioner, rtol=1e-9, device="cpu").solve(b)
    assert res.x.shape == (6, 64) and res.converged.all()
    for s, A in enumerate(mats):
        ref = alone(A, b[s], preconditioner=preconditioner, rtol=1e-9)
        assert res.iterations[s] == ref.iterations
        np.testing.assert_array_equal(res.x[s], ref.x)  # the same algorithm, the same bits
        assert res.true_residual_norms[s] == pytest.approx(ref.true_residual_norm, rel=1e-12)
    assert np.all(res.relative_residuals < 1e-8)


def test_one_pattern_with_many_value_arrays_and_an_initial_guess():
    pattern = variable_diffusion(np.ones((5, 7)))
    rng = np.random.default_rng(2)
    values = np.array([variable_diffusion(np.exp(rng.normal(size=(5, 7)))).data for _ in range(4)])
    batch = solvers.BatchedPCG.from_pattern(pattern, values, rtol=1e-10, device="cpu")
    b = np.ones((4, 35))
    x0 = rng.standard_normal((4, 35))
    x0_copy = x0.copy()
    res = batch.solve(b, x0)
    assert np.array_equal(x0, x0_copy)
    for s in range(4):
        A = sp.csr_matrix((values[s], pattern.indices, pattern.indptr), shape=pattern.shape)
        ref = alone(A, b[s], rtol=1e-10).x
        np.testing.assert_allclose(res.x[s], ref, rtol=1e-8, atol=1e-10)


def test_systems_of_different_sizes_come_back_as_a_list():
    mats = [poisson((4, 4)), poisson((3, 5)), poisson((6,))]
    b = [np.ones(16), np.arange(15.0), -np.ones(6)]
    res = solvers.BatchedPCG(mats, rtol=1e-10, device="cpu").solve(b)
    assert isinstance(res.x, list) and [v.size for v in res.x] == [16, 15, 6]
    for A, bs, xs in zip(mats, b, res.x):
        np.testing.assert_allclose(A @ xs, bs, atol=1e-8)


def test_a_failing_system_is_reported_alone():
    mats = diffusion_batch(4)
    n = 64
    indefinite = sp.diags(np.r_[np.ones(n // 2), -np.ones(n // 2)]).tocsr() + 0.05 * poisson((8, 8))
    mats[1] = indefinite
    b = np.ones((4, n))
    b[2, 5] = np.nan
    res = solvers.BatchedPCG(mats, preconditioner="none", rtol=1e-9, device="cpu").solve(b)
    assert res.reasons[1] is Reason.BREAKDOWN and res.info[1] == -1
    assert res.reasons[2] is Reason.NOT_FINITE and res.info[2] == -2
    assert res.reasons[0] is res.reasons[3] is Reason.CONVERGED
    ok = alone(mats[3], b[3], preconditioner="none", rtol=1e-9)
    np.testing.assert_array_equal(res.x[3], ok.x)
    res = solvers.BatchedPCG(mats[:1], rtol=1e-9, device="cpu").solve(b[:1], maxiter=3)
    assert res.reasons[0] is Reason.MAX_ITERATIONS and res.iterations[0] == 3


def test_relative_residuals_of_a_non_finite_b_are_nan_without_a_warning():
    res = solvers.BatchedPCG(diffusion_batch(2), rtol=1e-9, device="cpu").solve(np.ones((2, 64)))
    res.true_residual_norms[1] = res.b_norms[1] = np.inf  # as the GPU reports a system stopped for an inf in b
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        relative = res.relative_residuals
    assert relative[0] < 1e-9 and np.isnan(relative[1])


def test_a_convergence_the_true_residual_does_not_confirm_is_not_reported(monkeypatch):
    import solvers.pcg.batched as batched
    mats = diffusion_batch(2)
    real = batched.pcg_iterate

    def claims_convergence_for_the_second(matvec, psolve, b, x, tol, maxiter):
        if b[0] < 0:  # the second system: stop at once, x untouched, and claim convergence
            return Reason.CONVERGED, 0, 0.0
        return real(matvec, psolve, b, x, tol, maxiter)

    monkeypatch.setattr(batched, "pcg_iterate", claims_convergence_for_the_second)
    res = solvers.BatchedPCG(mats, rtol=1e-8, device="cpu").solve(np.stack([np.ones(64), -np.ones(64)]))
    assert res.reasons == [Reason.CONVERGED, Reason.INACCURATE]
    assert not res.converged[1] and res.info[1] > 0


def test_bad_input_names_the_system():
    mats = diffusion_batch(3)
    bad = mats[2].tolil()
    bad[4, 4] = -1.0
    with pytest.raises(InputError, match="system 2: Jacobi preconditioner needs a positive diagonal"):
        solvers.BatchedPCG(mats[:2] + [bad.tocsr()], device="cpu")
    with pytest.raises(InputError, match="system 1: the matrix must be square"):
        solvers.BatchedPCG([mats[0], sp.csr_matrix(np.ones((2, 3)))], device="cpu")
    batch = solvers.BatchedPCG(mats, device="cpu")
    with pytest.raises(InputError, match="b has 2 systems, expected 3"):
        batch.solve(np.ones((2, 64)))
    with pytest.raises(InputError, match=r"b: system 1 has shape \(63,\)"):
        batch.solve([np.ones(64), np.ones(63), np.ones(64)])
    with pytest.raises(InputError, match="values must have shape"):
        solvers.BatchedPCG.from_pattern(mats[0], np.ones((2, 3)), device="cpu")


@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
def test_numpy_reference_of_the_kernel_is_the_cpu_solver(variant):
    from solvers.kernels.onchip_ref import solve_system
    A = variable_diffusion(np.exp(np.random.default_rng(4).normal(size=(9, 9))))
    b = np.random.default_rng(5).standard_normal(81)
    x = np.linspace(-1.0, 1.0, 81)
    ref = solvers.PCG(A, device="cpu", rtol=1e-9, variant=variant).solve(b, x.copy())
    code, its, rnorm = solve_system(A, 1.0 / A.diagonal(), b, x, 1e-9 * np.linalg.norm(b), 1000, variant)
    assert Reason(code) is ref.reason and its == ref.iterations
    np.testing.assert_allclose(x, ref.x, rtol=1e-12, atol=1e-14)


@pytest.mark.gpu
def test_gpu_batch_agrees_with_cpu_and_isolates_failures():
    cupy = pytest.importorskip("cupy")
    mats = diffusion_batch(40, shape=(12, 10), seed=7)
    n = 120
    mats[3] = sp.diags(np.r_[np.ones(n // 2), -np.ones(n // 2)]).tocsr() + 0.05 * poisson((12, 10))
    b = np.random.default_rng(8).standard_normal((40, n))
    b[7, 0] = np.inf
    cpu = solvers.BatchedPCG(mats, preconditioner="none", rtol=1e-9, device="cpu").solve(b)
    gpu_batch = solvers.BatchedPCG(mats, preconditioner="none", rtol=1e-9, device="gpu")
    gpu = gpu_batch.solve(b)
    again = gpu_batch.solve(b)
    assert isinstance(gpu.x, cupy.ndarray) and cupy.array_equal(gpu.x, again.x)  # no scheduling effect
    assert gpu.reasons == cpu.reasons
    assert gpu.reasons[3] is Reason.BREAKDOWN and gpu.reasons[7] is Reason.NOT_FINITE
    ok = [s for s in range(40) if s not in (3, 7)]
    # other summation orders round differently: iteration counts within 2 of 60-80 (seen on an H200)
    assert np.all(np.abs(gpu.iterations[ok] - cpu.iterations[ok]) <= 2)
    assert np.all(gpu.relative_residuals[ok] < 2e-9) and np.all(cpu.relative_residuals[ok] < 2e-9)
    error = np.linalg.norm(gpu.x.get()[ok] - cpu.x[ok], axis=1) / np.linalg.norm(cpu.x[ok], axis=1)
    assert error.max() < 2e-6  # condition numbers up to 352 here: 2 x 352 x 1e-9 bounds the gap
    jac = solvers.BatchedPCG(mats[:3], rtol=1e-10, device="gpu").solve(b[:3])
    ref = solvers.BatchedPCG(mats[:3], rtol=1e-10, device="cpu").solve(b[:3])
    np.testing.assert_allclose(jac.x.get(), ref.x, rtol=1e-7, atol=1e-9)


def test_on_chip_layouts_follow_size_and_shared_memory():
    from solvers.mmio import read_matrix
    from solvers.pcg.onchip import choose_layout
    data = __import__("pathlib").Path(__file__).resolve().parent / "data" / "matrices"

    def layout(A, latency=True, count=1, variant="classic"):
        start = np.arange(count + 1) * A.shape[0]
        rowptr = sp.block_diag([A] * count, format="csr").indptr
        chosen = choose_layout(rowptr, start, 8, latency, variant)
        shape = chosen.shape
        return shape.block, shape.rows, shape.team, chosen.in_shared == chosen.entries

    assert layout(read_matrix(str(data / "gr_900_900_crg.mtx"))) == (480, 2, 1, True)
    assert layout(read_matrix(str(data / "1138_bus.mtx"))) == (384, 3, 1, True)
    assert layout(poisson((64, 64))) == (256, 1, 16, True)  # a row a thread on 16 blocks
    assert layout(poisson((64, 64)), latency=False, count=2) == (512, 1, 8, True)  # a batch: cluster_shape
    assert layout(poisson((100, 100))) == (640, 1, 16, True)
    assert layout(poisson((128, 128))) == (512, 2, 16, True)
    assert layout(poisson((256, 256))) == (1024, 4, 16, False)   # part of the matrix in global memory
    assert layout(variable_diffusion(np.ones((32, 32))), latency=False, count=3) == (128, 8, 1, True)
    with pytest.raises(InputError, match="too large to solve on chip"):
        layout(poisson((400, 400)))
    # single-reduction: in a cluster r, s and w of two iterations join u in shared memory
    assert layout(poisson((128, 128)), variant="single-reduction") == (512, 2, 16, True)
    # above one cluster single-reduction spreads over several (spread_shape), classic does not
    assert layout(poisson((256, 256)), variant="single-reduction") == (608, 1, 16, True)


def test_one_system_holds_its_first_entries_in_registers_a_batch_none():
    from solvers.pcg.onchip import Shape, choose_layout, held_entries, latency_shape
    A = poisson((64, 64))  # rows of at most 5 entries: all in registers
    one = choose_layout(A.indptr, [0, A.shape[0]], 8, True, "single-reduction")
    assert one.held == 5 and one.entries == 0 and "matrix in registers" in one.describe()
    batch = choose_layout(sp.block_diag([A] * 2, format="csr").indptr, [0, 4096, 8192], 8, False)
    assert batch.held == 0 and batch.entries == 32 * 5 * (batch.shape.chunk // 32)
    # fewer registers a thread (more threads or rows) leave room for fewer entries; float32 for more
    shape = latency_shape(900)
    assert held_entries(Shape(480, 3, 1), "classic", 8, 9) < held_entries(shape, "classic", 8, 9) <= 9
    assert held_entries(shape, "single-reduction", 8, 9) < held_entries(shape, "single-reduction", 4, 9)
    assert held_entries(latency_shape(60_000, spread=False), "classic", 8, 5) == 0  # 1,024 threads: 64 registers
    # a system spread over clusters keeps registers for the mirror's addresses: Poisson 256^2 holds 3 of 5
    assert held_entries(latency_shape(65_536), "single-reduction", 8, 5) == 3
    assert held_entries(shape, "classic", 8, 2) == 2  # never more than the longest row


def test_one_row_a_thread_on_16_blocks_unless_that_reads_too_much_from_other_blocks():
    from solvers.pcg.onchip import ONCHIP_MAX_REMOTE, Shape, choose_path, latency_shape, remote_fraction

    def pattern(A):
        return A.indptr, A.indices

    five = poisson((64, 64))  # 256 rows a block: 4 grid lines, the outer two read a line of a neighbour
    assert latency_shape(4096, pattern(five)) == latency_shape(4096) == Shape(256, 1, 16)
    assert 0.09 < remote_fraction(*pattern(five), Shape(256, 1, 16)) <= ONCHIP_MAX_REMOTE
    # a 9-point stencil reads three entries of a neighbour's line: 512 rows a block instead
    nine = (sp.kron(sp.eye(64), poisson((64,))) + sp.kron(poisson((64,)), sp.eye(64))
            + sp.kron(sp.diags([1.0, 1.0], [-1, 1], (64, 64)), sp.diags([1.0, 1.0], [-1, 1], (64, 64)))).tocsr()
    assert nine.nnz == (3 * 64 - 2) ** 2
    assert remote_fraction(*pattern(nine), Shape(256, 1, 16)) > ONCHIP_MAX_REMOTE
    assert latency_shape(4096, pattern(nine)) == Shape(512, 1, 8)
    assert choose_path("auto", 4096, A=nine)[0] == "on-chip"
    assert latency_shape(10_000) == Shape(640, 1, 16) and latency_shape(10_241) == Shape(512, 2, 11)


def test_single_reduction_spreads_a_system_too_large_for_one_cluster_over_several():
    from solvers.pcg.onchip import (MAX_GROUPS, ONCHIP_MAX_ROWS, SPREAD_MAX_ROWS, Shape, auto_variant, choose_path,
                                    cluster_shape, latency_shape)
    assert latency_shape(65_536) == Shape(608, 1, 16, 7) and Shape(608, 1, 16, 7).chunk * 16 * 7 >= 65_536
    assert latency_shape(ONCHIP_MAX_ROWS + 1) == Shape(544, 1, 16, 2)
    assert latency_shape(ONCHIP_MAX_ROWS).groups == 1  # one cluster up to its limit
    assert latency_shape(SPREAD_MAX_ROWS).groups == MAX_GROUPS and latency_shape(SPREAD_MAX_ROWS).block == 640
    assert latency_shape(65_536, spread=False) == cluster_shape(65_536)
    assert "7 clusters of 16 blocks of 608 threads" in Shape(608, 1, 16, 7).describe()
    A = poisson((256, 256))
    assert auto_variant(A.indptr, np.array([0, A.shape[0]]), 8, A.indices) == "single-reduction"
    path, note = choose_path("auto", A.shape[0], "auto", "jacobi", A)
    assert path == "on-chip" and "inside 7 clusters" in note
    path, note = choose_path("auto", A.shape[0], "classic", "jacobi", A)
    assert path == "grid" and "classic PCG on chip runs inside one cluster" in note
    assert choose_path("auto", SPREAD_MAX_ROWS + 1)[0] == "grid"
    # numbered at random, nearly every entry is read from another block: the whole GPU
    rng = np.random.default_rng(0)
    order = rng.permutation(A.shape[0])
    path, note = choose_path("auto", A.shape[0], "auto", "jacobi", A[order][:, order].tocsr())
    assert path == "grid" and "read from another block" in note


def test_auto_runs_classic_on_chip_only_in_one_block_holding_whole_rows_in_registers():
    from solvers.mmio import read_matrix
    from solvers.pcg.onchip import auto_variant
    data = __import__("pathlib").Path(__file__).resolve().parent / "data" / "matrices"

    def auto(A, itemsize=8):
        return auto_variant(A.indptr, [0, A.shape[0]], itemsize)

    assert auto(read_matrix(str(data / "gr_900_900_crg.mtx"))) == "classic"  # one block, 9 entries a row held
    assert auto(poisson((32, 32))) == "classic"
    assert auto(read_matrix(str(data / "1138_bus.mtx"))) == "single-reduction"  # rows of up to 18, 8 held
    assert auto(poisson((64, 64))) == auto(poisson((128, 128))) == "single-reduction"  # clusters
    # above one cluster: single-reduction, which spreads over several
    assert auto(poisson((200, 200))) == auto(poisson((256, 256))) == "single-reduction"


def test_slice_capacity_counts_each_block_s_slices_at_their_longest_row():
    from solvers.pcg.onchip import Shape, slice_capacity
    lengths = np.r_[np.full(31, 2), 5, np.full(32, 3), np.full(10, 1)]  # 74 rows: slices of 32, 32, 10
    rowptr = np.r_[0, np.cumsum(lengths)]
    assert slice_capacity(rowptr, [0, 74], Shape(64, 1, 2)) == 32 * (5 + 3)  # block 0: two slices
    assert slice_capacity(rowptr, [0, 74], Shape(32, 1, 3)) == 32 * 5
    # two systems: each starts its own slices and blocks
    twice = np.r_[0, np.cumsum(np.r_[lengths, lengths[:40]])]
    assert slice_capacity(twice, [0, 74, 114], Shape(128, 1, 1)) == 32 * (5 + 3 + 1)
    # the first `held` entries of each row sit in registers: slices as wide as the rest
    assert slice_capacity(rowptr, [0, 74], Shape(64, 1, 2), held=2) == 32 * (3 + 1)
    assert slice_capacity(rowptr, [0, 74], Shape(64, 1, 2), held=5) == 0
    # held counts by a thread's k-th rows: block 0's slices are its threads' first and second rows
    assert slice_capacity(rowptr, [0, 74], Shape(32, 2, 2), held=(4, 1)) == 32 * ((5 - 4) + (3 - 1))
    assert slice_capacity(rowptr, [0, 74], Shape(32, 2, 2), held=(1, 4)) == 32 * ((5 - 1) + 0)


def test_one_block_lays_its_rows_out_by_length_where_that_holds_fewer_padding_entries():
    from solvers.mmio import read_matrix
    from solvers.pcg.onchip import Shape, choose_layout, length_order, slice_capacity, slice_walk
    shape = Shape(64, 3, 1)  # 2 warps, 3 rows a thread: 192 slots
    lengths = np.random.default_rng(1).integers(2, 9, 180)
    lengths[[7, 90]] = 20
    order, held_k = length_order(lengths, shape, 8)
    assert sorted(order) == list(range(180))
    slots = np.zeros(shape.chunk, dtype=np.int64)
    slots[:180] = lengths[order]
    by_k = slots.reshape(3, 64)
    # each row group's rows are the next longest, dealt lane by lane over the warps (a warp's rows as long)
    assert by_k[0].min() >= by_k[1].max() and by_k[1].min() >= by_k[2][by_k[2] > 0].max()
    assert list(by_k[0][[0, 32]]) == [20, 20]  # the two longest rows: lane 0 of either warp
    assert held_k == tuple(min(8, int(g.max())) for g in by_k) and sum(held_k) < 3 * 8
    # rows of one length, or one row a thread, or a cluster: nothing to gain
    assert length_order(np.full(180, 5), shape, 5) == (None, None)
    assert length_order(lengths[:60], Shape(64, 1, 1), 8) == (None, None)
    assert length_order(lengths, Shape(32, 3, 2), 8) == (None, None)
    # 1138_bus: its k-th rows hold 8, 4 and 3 entries instead of 8 each; the slices are those of the
    # rows in the slots' order, their walk as short
    A = read_matrix(str(__import__("pathlib").Path(__file__).resolve().parent / "data" / "matrices" / "1138_bus.mtx"))
    n = A.shape[0]
    layout = choose_layout(A.indptr, [0, n], 8, True, "single-reduction", A.indices)
    assert layout.held_k == (8, 4, 3) and "rows by length" in layout.describe()
    ordered = np.r_[0, np.cumsum(np.diff(A.indptr)[layout.order])]
    assert layout.entries == slice_capacity(ordered, [0, n], layout.shape, layout.held_k)
    assert slice_walk(A.indptr, layout) <= 6
    # a batch keeps every system's rows as given
    batch = choose_layout(sp.block_diag([A] * 2, format="csr").indptr, [0, n, 2 * n], 8, False)
    assert batch.order is None and batch.held_k is None


@pytest.mark.parametrize("tails, expected", [
    ([0] * 31 + [10], (2, 4)),  # 1138_bus's widest slice: 2 steps, 4 helpers of 2 entries, not 10 steps
    ([0] * 30 + [10, 10], (2, 4)),  # two long rows, 8 of the 30 idle lanes helping
    ([1] * 31 + [10], (10, 0)),  # no idle lane: the row walks alone
    ([0] * 31 + [400], (20, 19)),  # 19 helpers of 20 entries: 39, where 13 entries (30 helpers) make 43
    ([0] * 32, (0, 0)),
    ([0] * 31 + [2], (2, 0)),  # 1 step and 1 shuffle is no better than 2 steps
])
def test_a_slice_shares_its_long_rows_with_idle_lanes_at_the_fewest_steps_and_shuffles(tails, expected):
    from solvers.pcg.onchip import shared_slice
    steps, shuffles = shared_slice(tails)
    assert (steps, shuffles) == expected
    # the long rows' helpers (W entries each) are idle lanes enough, and the shuffles are the most any row needs
    helpers = [(t - 1) // steps for t in tails if t > steps]
    assert sum(helpers) <= tails.count(0) and shuffles == max(helpers, default=0)


def test_auto_keeps_on_chip_only_matrices_that_stay_on_chip_with_short_slices(monkeypatch):
    from solvers.gallery import power_law_laplacian
    from solvers.pcg import onchip

    def star(n, spokes):  # a path of n vertices, its middle joined to `spokes` others
        others = np.random.default_rng(0).choice(np.delete(np.arange(n), n // 2), spokes, replace=False)
        edges = sp.coo_matrix((np.ones(spokes), (np.full(spokes, n // 2), others)), shape=(n, n))
        adjacency = (sp.diags([np.ones(n - 1), np.ones(n - 1)], [-1, 1]) + edges + edges.T).tocsr()
        return (sp.diags(np.asarray(adjacency.sum(axis=1)).ravel() + 1e-2) - adjacency).tocsr()

    A = star(1000, 120)  # one block, 8 entries a row held: 115 steps, 21 with the idle lanes' help
    layout = onchip.choose_layout(A.indptr, np.array([0, 1000]), 8, True, "single-reduction", A.indices)
    assert layout.shares_rows and onchip.slice_walk(A.indptr, layout) <= onchip.ONCHIP_MAX_WALK
    assert onchip.choose_path("auto", 1000, "single-reduction", A=A)[0] == "on-chip"
    # rows holding fewer entries than they have leave no lane idle: the long row walks alone
    monkeypatch.setattr(onchip, "held_entries", lambda *args: 2)
    path, note = onchip.choose_path("auto", 1000, "single-reduction", A=A)
    assert path == "grid" and "would take 121 steps of a warp" in note
    monkeypatch.undo()
    path, note = onchip.choose_path("auto", 1000, A=power_law_laplacian(1000))
    assert path == "grid" and "in global memory on chip" in note


def test_auto_kernel_path_follows_size_variant_and_preconditioner():
    from solvers.pcg.onchip import ONCHIP_MAX_ROWS, choose_path
    assert choose_path("auto", ONCHIP_MAX_ROWS)[0] == "on-chip"
    stencil = poisson((100, 100))  # a cluster of 16 blocks: 6% of the entries in another block
    assert choose_path("auto", 10_000, A=stencil)[0] == "on-chip"
    shuffled = np.random.default_rng(0).permutation(10_000)
    path, note = choose_path("auto", 10_000, A=stencil[shuffled][:, shuffled].tocsr())
    assert path == "grid" and "read from another block" in note
    assert choose_path("auto", ONCHIP_MAX_ROWS + 1)[0] == "on-chip"  # over several clusters
    for variant in ("classic", "single-reduction"):  # the on-chip kernel runs both
        assert choose_path("auto", 100, variant)[0] == "on-chip"
    assert choose_path("auto", 100, "auto", "chebyshev") == (
        "grid", "auto: the on-chip path applies Jacobi or no preconditioner, not 'chebyshev'")
    with pytest.raises(InputError, match="on-chip path applies Jacobi or no preconditioner"):
        choose_path("on-chip", 100, "auto", "amg")
    assert choose_path("grid", 10) == ("grid", None)
