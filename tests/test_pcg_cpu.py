"""CPU PCG: agreement with SciPy and the SciPy ``cg`` contract."""
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

import solvers
from solvers.gallery import anisotropic_diffusion, poisson
from solvers.mmio import read_matrix
from solvers.pcg.result import Reason

SHARED = ["1138_bus.mtx", "lap2D_5pt_n100.mtx", "gr_900_900_crg.mtx", "ginkgo_simple_A.mtx"]


def generated_cases():
    return {
        "poisson2d_32": poisson((32, 32)),
        "poisson3d_12": poisson((12, 12, 12)),
        "aniso2d_24": anisotropic_diffusion((24, 24), eps=0.01),
    }


def case_matrices(matrices_dir):
    cases = dict(generated_cases())
    for name in SHARED:
        cases[name] = read_matrix(str(matrices_dir / name))
    return cases


def scipy_reference(A, b, rtol, M=None):
    count = [0]

    def cb(_):
        count[0] += 1

    x, info = spla.cg(A, b, rtol=rtol, M=M, maxiter=20 * A.shape[0], callback=cb)
    return x, info, count[0]


@pytest.mark.parametrize("precond", ["none", "jacobi"])
def test_agrees_with_scipy_on_case_table(matrices_dir, precond):
    for name, A in case_matrices(matrices_dir).items():
        rng = np.random.default_rng(1)
        b = rng.standard_normal(A.shape[0])
        M = sp.diags(1.0 / A.diagonal()) if precond == "jacobi" else None
        xs, info_s, its_s = scipy_reference(A, b, 1e-8, M)
        res = solvers.PCG(A, preconditioner=precond, rtol=1e-8, maxiter=20 * A.shape[0], device="cpu").solve(b)
        assert info_s == 0 and res.info == 0, name
        assert abs(res.iterations - its_s) <= 1, (name, res.iterations, its_s)
        scale = np.linalg.norm(xs)
        assert np.linalg.norm(res.x - xs) <= 1e-6 * scale, name
        assert res.true_residual_norm <= 1.01e-8 * np.linalg.norm(b) + 1e-12, name


def test_cg_function_matches_scipy_signature_and_result():
    A = poisson((20, 20))
    b = np.ones(A.shape[0])
    x, info = solvers.cg(A, b, rtol=1e-10)
    xs, infos = spla.cg(A, b, rtol=1e-10)
    assert info == 0 and infos == 0
    np.testing.assert_allclose(x, xs, rtol=1e-8)


def test_tolerance_rule_uses_max_of_atol_and_rtol():
    A = poisson((16, 16))
    b = np.ones(A.shape[0])
    res = solvers.PCG(A, rtol=1e-3, atol=1e-1, device="cpu").solve(b)
    assert res.tolerance == pytest.approx(max(1e-1, 1e-3 * np.linalg.norm(b)))
    assert res.residual_norm <= res.tolerance


def test_maxiter_one_gives_info_one():
    A = poisson((16, 16))
    x, info = solvers.cg(A, np.ones(A.shape[0]), maxiter=1)
    assert info == 1


def test_x0_untouched_and_used():
    A = poisson((16, 16))
    b = np.ones(A.shape[0])
    x_exact = spla.spsolve(A.tocsc(), b)
    x0 = x_exact + 1e-3
    keep = x0.copy()
    res = solvers.PCG(A, rtol=1e-10, device="cpu").solve(b, x0)
    assert np.array_equal(x0, keep)
    cold = solvers.PCG(A, rtol=1e-10, device="cpu").solve(b)
    assert res.iterations < cold.iterations


def test_callback_called_once_per_iteration():
    A = poisson((16, 16))
    calls = []
    x, info = solvers.cg(A, np.ones(A.shape[0]), callback=lambda xk: calls.append(xk.copy()))
    res = solvers.PCG(A, preconditioner="none", device="cpu").solve(np.ones(A.shape[0]))
    assert info == 0 and len(calls) == res.iterations > 0
    np.testing.assert_allclose(calls[-1], x)


def test_zero_rhs_returns_zero_in_zero_iterations():
    A = poisson((8, 8))
    x, info = solvers.cg(A, np.zeros(A.shape[0]))
    assert info == 0 and not x.any()


def test_dense_and_linear_operator_inputs():
    A = poisson((10, 10))
    b = np.arange(A.shape[0], dtype=float)
    x_dense, info_d = solvers.cg(A.toarray(), b, rtol=1e-10)
    op = spla.LinearOperator(A.shape, matvec=A.dot, dtype=float)
    x_op, info_o = solvers.cg(op, b, rtol=1e-10, M=spla.LinearOperator(A.shape, matvec=lambda r: r / 4.0))
    assert info_d == 0 and info_o == 0
    np.testing.assert_allclose(x_dense, x_op, rtol=1e-7)


def test_indefinite_matrix_reports_breakdown():
    A = sp.diags([1.0, 2.0, -3.0, 4.0]).tocsr()
    res = solvers.PCG(A, preconditioner="none", device="cpu").solve(np.ones(4))
    assert res.reason is Reason.BREAKDOWN and res.info < 0 and not res.converged


def test_jacobi_rejects_nonpositive_diagonal():
    A = sp.csr_matrix(np.array([[0.0, 1.0], [1.0, 2.0]]))
    with pytest.raises(solvers.InputError, match="positive diagonal"):
        solvers.PCG(A, preconditioner="jacobi", device="cpu")


def test_nan_in_rhs_reports_not_finite():
    A = poisson((6, 6))
    b = np.ones(A.shape[0])
    b[3] = np.nan
    res = solvers.PCG(A, device="cpu").solve(b)
    assert res.reason is Reason.NOT_FINITE and res.info == -2


def test_history_and_result_fields():
    A = poisson((12, 12))
    solver = solvers.PCG(A, device="cpu", record_history=True, rtol=1e-9)
    res = solver.solve(np.ones(A.shape[0]))
    assert len(res.history) == res.iterations + 1
    assert res.history[-1] == pytest.approx(res.residual_norm)
    assert res.true_residual_norm == pytest.approx(res.residual_norm, rel=1e-3)
    assert res.setup_time > 0 and res.solve_time > 0 and res.device == "cpu"


def test_float32_converges():
    A = poisson((16, 16))
    res = solvers.PCG(A, device="cpu", dtype="float32", rtol=1e-5).solve(np.ones(A.shape[0]))
    assert res.converged and res.x.dtype == np.float32


def test_many_solves_reuse_setup_and_update_values():
    A = poisson((12, 12))
    solver = solvers.PCG(A, device="cpu", rtol=1e-10)
    for seed in range(3):
        b = np.random.default_rng(seed).standard_normal(A.shape[0])
        assert solver.solve(b).converged
    solver.update_values(2.0 * A)
    b = np.ones(A.shape[0])
    res = solver.solve(b)
    np.testing.assert_allclose(res.x, spla.spsolve((2.0 * A).tocsc(), b), rtol=1e-7)


def test_graph_modes_need_gpu_on_cpu():
    A = poisson((4, 4))
    with pytest.raises(solvers.DeviceError, match="needs a GPU"):
        solvers.PCG(A, device="cpu", mode="while")


def test_single_reduction_variant_matches_classic_on_case_table(matrices_dir):
    for name, A in case_matrices(matrices_dir).items():
        b = np.random.default_rng(2).standard_normal(A.shape[0])
        runs = {v: solvers.PCG(A, rtol=1e-8, maxiter=20 * A.shape[0], device="cpu", variant=v,
                               record_history=True).solve(b) for v in ("classic", "single-reduction")}
        c, s = runs["classic"], runs["single-reduction"]
        assert c.converged and s.converged, name
        assert abs(c.iterations - s.iterations) <= max(1, int(0.02 * c.iterations)), (name, c.iterations, s.iterations)
        assert np.linalg.norm(s.x - c.x) <= 1e-6 * np.linalg.norm(c.x), name
        # same iterates in exact arithmetic: the first residuals agree closely
        np.testing.assert_allclose(s.history[:8], c.history[:8], rtol=1e-8)


def test_single_reduction_variant_reports_failures_and_calls_back():
    A = poisson((10, 10))
    n = A.shape[0]
    calls = []
    res = solvers.PCG(A, device="cpu", variant="single-reduction").solve(np.ones(n), callback=calls.append)
    assert res.converged and len(calls) == res.iterations > 0
    b = np.ones(n)
    b[4] = np.nan
    assert solvers.PCG(A, device="cpu", variant="single-reduction").solve(b).reason is Reason.NOT_FINITE
    indef = sp.diags([1.0, 2.0, -3.0, 4.0]).tocsr()
    res = solvers.PCG(indef, preconditioner="none", device="cpu", variant="single-reduction").solve(np.ones(4))
    assert res.reason is Reason.BREAKDOWN
    res = solvers.PCG(A, device="cpu", variant="single-reduction").solve(np.ones(n), maxiter=3)
    assert res.reason is Reason.MAX_ITERATIONS and res.iterations == 3
    with pytest.raises(solvers.InputError, match="variant"):
        solvers.PCG(A, device="cpu", variant="pipelined")


def test_auto_variant_is_classic_on_the_cpu_and_reported():
    from solvers.pcg.cpu import SINGLE_REDUCTION_MAX_ROWS, resolve_variant
    A = poisson((8, 8))
    assert solvers.PCG(A, device="cpu").variant == "classic"
    assert solvers.PCG(A, device="cpu", variant="single-reduction").variant == "single-reduction"
    assert resolve_variant("auto", SINGLE_REDUCTION_MAX_ROWS, "gpu") == "single-reduction"
    assert resolve_variant("auto", SINGLE_REDUCTION_MAX_ROWS + 1, "gpu") == "classic"


def test_enqueue_and_a_kernel_path_need_the_gpu():
    solver = solvers.PCG(poisson((6, 6)), device="cpu")
    with pytest.raises(solvers.DeviceError, match="enqueue runs a solve on the GPU"):
        solver.enqueue(np.ones(36), np.empty(36))
    with pytest.raises(solvers.InputError, match="--path: 'on-chip' is a GPU kernel"):
        solvers.PCG(poisson((6, 6)), device="cpu", path="on-chip")


@pytest.mark.parametrize("n, held", [(1_000_000, 8), (1_081_344, 8), (1_081_345, 0), (2_000_000, 0), (10, 1)])
def test_residual_held_for_all_of_a_threads_rows_or_none(n, held):
    from solvers.pcg.gpu import HELD_BYTES, held_rows

    # 132 blocks of 1,024 threads, float64: 8 rows a thread fill HELD_BYTES
    assert HELD_BYTES == 8 * 1024 * 8
    assert held_rows(n, 132, 1024, 200_000, 8) == held
    assert held_rows(1_000_000, 132, 1024, 32_768, 8) == 0  # nor beyond the block's shared memory
    # a count asked for: at most the thread's rows, and what fits in the block's shared memory
    assert held_rows(n, 132, 1024, 200_000, 8, requested=1) == 1
    assert held_rows(2_000_000, 132, 1024, 200_000, 8, requested=100) == 15  # the thread's rows
    assert held_rows(2_000_000, 132, 1024, 65_536, 8, requested=100) == 8  # what fits
    assert held_rows(10, 132, 1024, 200_000, 8, requested=5) == 1


@pytest.mark.parametrize("options", [{}, {"preconditioner": "chebyshev"}, {"preconditioner": "amg"},
                                     {"reorder": "rcm"}, {"variant": "single-reduction"}],
                         ids=["jacobi", "chebyshev", "amg", "rcm", "single-reduction"])
def test_a_dropped_solver_is_freed_at_once(options):
    """Nothing the solver keeps refers back to it: ``del`` frees it (and its arrays) without waiting for
    Python's cyclic garbage collector, which runs on the count of Python objects, not on memory."""
    import gc
    import weakref
    A = poisson((10, 10, 10))
    solver = solvers.PCG(A, device="cpu", rtol=1e-8, **options)
    assert solver.solve(np.ones(A.shape[0])).converged
    gc.collect()
    gc.disable()
    try:
        ref = weakref.ref(solver)
        del solver
        assert ref() is None
    finally:
        gc.enable()


def test_held_weakly_calls_a_method_without_keeping_its_object():
    """The engine's bodies and the distributed steps are methods of the objects that keep them."""
    import gc
    import weakref
    from solvers.engine import held_weakly

    class Owner:
        def __init__(self):
            self.step = held_weakly(self.add)

        def add(self, a, b):
            return a + b

    assert held_weakly(len) is len  # not a bound method: as it is
    gc.collect()
    gc.disable()
    try:
        owner = Owner()
        assert owner.step(2, 3) == 5
        step, ref = owner.step, weakref.ref(owner)
        del owner
        assert ref() is None
        with pytest.raises(RuntimeError, match="method add .* no longer exists"):
            step(2, 3)
    finally:
        gc.enable()
