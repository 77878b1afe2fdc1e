"""Preconditioner plug-ins on the CPU: Chebyshev and smoothed-aggregation AMG against SciPy and PyAMG.

The two problems are the hard ones for Jacobi (``solvers.gallery``): rotated
anisotropic diffusion (PyAMG's ``diffusion_stencil_2d(epsilon=1e-3, theta=pi/6)``)
and 2-D linear elasticity with its rigid body modes, at sizes that solve in a
fraction of a second. Iteration counts are to rtol 1e-8, as PyAMG's ``solve``
counts them (``||r|| < tol ||b||``, the stopping rule of this project's PCG).
"""
import sys

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from hypothesis import given, strategies as st

import solvers
from solvers.errors import InputError
from solvers.gallery import linear_elasticity_2d, poisson, rotated_anisotropic_diffusion
from solvers.pcg import AMG, BatchedPCG, Chebyshev, Jacobi, PCG, Preconditioner
from solvers.pcg.preconditioners.smoothers import ChebyshevSmoother
from solvers.pcg.preconditioners.spectrum import largest_scaled_eigenvalue

from fuzzing import fuzz, spd_matrices

pyamg = pytest.importorskip("pyamg")  # the test extra installs it (CI runs these); skipped where it is absent

RTOL = 1e-8


@pytest.fixture(scope="module")
def problems():
    """``name -> (A, near-nullspace or None, b)``."""
    A_el, B_el = linear_elasticity_2d((64, 64))
    cases = {"diffusion": (rotated_anisotropic_diffusion((128, 128)), None), "elasticity": (A_el, B_el)}
    return {name: (A, B, np.random.default_rng(0).random(A.shape[0])) for name, (A, B) in cases.items()}


def iterations(A, b, preconditioner, **options):
    res = PCG(A, preconditioner=preconditioner, rtol=RTOL, maxiter=3000, device="cpu", **options).solve(b)
    assert res.converged, (preconditioner, res.reason.label)
    assert res.true_residual_norm <= 2 * RTOL * np.linalg.norm(b)
    return res.iterations


def pyamg_iterations(A, B, b, **options):
    """Iterations of PyAMG's own ``smoothed_aggregation_solver(...).solve(accel='cg')``."""
    residuals = []
    np.random.seed(0)  # PyAMG estimates spectral radii from np.random vectors: seeded as the plug-in seeds them
    ml = pyamg.smoothed_aggregation_solver(A, B=B, **options)
    ml.solve(b, tol=RTOL, accel="cg", maxiter=2000, residuals=residuals)
    assert residuals[-1] < RTOL * np.linalg.norm(b)
    return len(residuals) - 1, ml


# -- Chebyshev ------------------------------------------------------------------------------------
def test_lanczos_bound_is_below_and_close_to_the_largest_eigenvalue(problems):
    for name, (A, _, _) in problems.items():
        dinv = 1.0 / A.diagonal()
        scaled = sp.diags(np.sqrt(dinv)) @ A @ sp.diags(np.sqrt(dinv))
        exact = spla.eigsh(scaled, k=1, which="LA", return_eigenvectors=False)[0]
        estimate = largest_scaled_eigenvalue(A, dinv)
        assert 0.95 * exact <= estimate <= exact * (1 + 1e-12), name
        assert ChebyshevSmoother(A).upper >= exact, name  # the safety factor covers the underestimate


@pytest.mark.parametrize("degree", [1, 2, 3, 6])
def test_chebyshev_applies_pyamgs_polynomial_in_the_scaled_matrix(problems, degree):
    """The recurrence gives ``p(D^-1 A) D^-1 r`` with ``1 - x p(x)`` PyAMG's Chebyshev polynomial on the interval."""
    from pyamg.relaxation.chebyshev import chebyshev_polynomial_coefficients

    A, _, r = problems["diffusion"]
    smoother = ChebyshevSmoother(A, degree)
    coefficients = -chebyshev_polynomial_coefficients(smoother.lower, smoother.upper, degree)[:-1]
    dinv = 1.0 / A.diagonal()
    expected = np.zeros_like(r)
    for c in coefficients:  # Horner in D^-1 A
        expected = dinv * (A @ expected) + c * (dinv * r)
    z = Chebyshev(degree).setup(A).apply(r)
    assert np.linalg.norm(z - expected) <= 1e-10 * np.linalg.norm(expected)


@pytest.mark.parametrize("problem", ["diffusion", "elasticity"])
@pytest.mark.parametrize("degree, most", [(3, 0.45), (5, 0.3)])
def test_chebyshev_cuts_jacobi_iterations(problems, problem, degree, most):
    A, _, b = problems[problem]
    jacobi = iterations(A, b, "jacobi")
    assert iterations(A, b, Chebyshev(degree)) <= most * jacobi


def test_chebyshev_preconditioner_agrees_with_scipy_cg(problems):
    A, _, b = problems["elasticity"]
    M = Chebyshev(4).setup(A)
    count = [0]
    x_ref, info = spla.cg(A, b, rtol=RTOL, maxiter=5000, M=spla.LinearOperator(A.shape, M.apply, dtype=A.dtype),
                          callback=lambda _: count.__setitem__(0, count[0] + 1))
    res = PCG(A, preconditioner=Chebyshev(4), rtol=RTOL, device="cpu").solve(b)
    assert info == 0 and abs(res.iterations - count[0]) <= 1
    assert np.linalg.norm(res.x - x_ref) <= 1e-6 * np.linalg.norm(x_ref)


@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_new_preconditioners_run_every_cpu_variant_and_dtype(variant, dtype):
    A = rotated_anisotropic_diffusion((24, 24))
    b = np.ones(A.shape[0])
    for preconditioner in ("chebyshev", "amg"):
        res = PCG(A, preconditioner=preconditioner, rtol=1e-5, variant=variant, dtype=dtype, device="cpu").solve(b)
        assert res.converged and res.x.dtype == np.dtype(dtype), preconditioner


# -- AMG against PyAMG ----------------------------------------------------------------------------
SAME_SMOOTHER = {  # our AMG options -> PyAMG's smoothers doing the same (PyAMG's Chebyshev is in A, ours in D^-1 A)
    "jacobi": (dict(smoother="jacobi"), ("jacobi", {"omega": 4.0 / 3.0})),
    "jacobi x2": (dict(smoother="jacobi", sweeps=2), ("jacobi", {"omega": 4.0 / 3.0, "iterations": 2})),
    "chebyshev": (dict(smoother="chebyshev"), ("chebyshev", {"degree": 3})),
}


@pytest.mark.parametrize("problem", ["diffusion", "elasticity"])
@pytest.mark.parametrize("smoother", sorted(SAME_SMOOTHER))
def test_amg_pcg_matches_pyamg_with_the_same_smoother(problems, problem, smoother):
    A, B, b = problems[problem]
    ours, theirs_smoother = SAME_SMOOTHER[smoother]
    solver = PCG(A, preconditioner=AMG(near_nullspace=B, **ours), rtol=RTOL, device="cpu")
    res = solver.solve(b)
    details = solver.preconditioner_details
    theirs, ml = pyamg_iterations(A, B, b, max_coarse=details["coarse_size"],
                                  strength=("symmetric", {"theta": details["theta"]}),
                                  presmoother=theirs_smoother, postsmoother=theirs_smoother)
    assert res.converged and abs(res.iterations - theirs) <= 0.1 * theirs, (res.iterations, theirs)
    # the same hierarchy, described as PyAMG describes it
    details = solver.preconditioner_details
    assert [(lv["rows"], lv["nonzeros"]) for lv in details["levels"]] == [
        (lvl.A.shape[0], lvl.A.nnz) for lvl in ml.levels]
    assert details["operator_complexity"] == pytest.approx(ml.operator_complexity(), rel=1e-12)
    assert details["grid_complexity"] == pytest.approx(ml.grid_complexity(), rel=1e-12)


@pytest.mark.parametrize("problem", ["diffusion", "elasticity"])
@pytest.mark.parametrize("options", [{}, dict(smoother="jacobi", sweeps=2)], ids=["default", "jacobi x2"])
def test_amg_pcg_within_1_5x_of_pyamg_gauss_seidel_default(problems, problem, options):
    A, B, b = problems[problem]
    theirs, _ = pyamg_iterations(A, B, b)
    ours = iterations(A, b, AMG(near_nullspace=B, **options))
    assert ours <= 1.5 * theirs, (ours, theirs)
    assert ours * 10 < iterations(A, b, "jacobi")


def test_amg_cycle_is_a_symmetric_positive_definite_preconditioner():
    A = rotated_anisotropic_diffusion((20, 20))
    for smoother in ("chebyshev", "jacobi"):
        M = AMG(smoother=smoother, coarse_size=10).setup(A)
        assert len(M.levels) >= 2
        dense = np.column_stack([M.apply(e) for e in np.eye(A.shape[0])])
        assert np.abs(dense - dense.T).max() <= 1e-10 * np.abs(dense).max()
        assert np.linalg.eigvalsh(dense).min() > 0


def test_update_values_keeps_the_aggregation_and_recomputes_the_rest():
    A = rotated_anisotropic_diffusion((64, 64))
    A2 = rotated_anisotropic_diffusion((64, 64), epsilon=1e-2, theta=np.pi / 3)
    assert np.array_equal(A.indptr, A2.indptr) and np.array_equal(A.indices, A2.indices)
    b = np.ones(A.shape[0])
    solver = PCG(A, preconditioner=AMG(coarse_size=20), rtol=RTOL, device="cpu")
    before = solver._impl.M
    aggregates = [lvl.AggOp.toarray() for lvl in before._ml.levels[:-1]]
    coarse_before = before.levels[1].A.toarray()
    solver.update_values(A2)
    after = solver._impl.M
    assert after.aggregation_reused and solver.preconditioner_details["aggregation"] == "reused (values updated)"
    kept = [lvl.AggOp.toarray() for lvl in after._ml.levels[:-1]]
    assert len(kept) == len(aggregates) and all(np.array_equal(a, k) for a, k in zip(aggregates, kept))
    # the numeric parts follow the new values: Galerkin operators R A2 P with the new prolongators
    P, R = after.levels[0].P, after.levels[0].R
    assert np.abs(R @ A2 @ P - after.levels[1].A).max() <= 1e-12 * np.abs(after.levels[1].A).max()
    assert not np.allclose(after.levels[1].A.toarray(), coarse_before)
    res = solver.solve(b)
    fresh = PCG(A2, preconditioner=AMG(coarse_size=20), rtol=RTOL, device="cpu").solve(b)
    assert res.converged and res.iterations <= 1.2 * fresh.iterations
    np.testing.assert_allclose(res.x, fresh.x, rtol=1e-6)
    # a new pattern aggregates again
    solver.update_values(poisson((64, 64)))
    assert not solver._impl.M.aggregation_reused and solver.solve(b).converged


def test_near_nullspace_follows_a_reordering(problems):
    A, B, b = problems["elasticity"]
    plain = iterations(A, b, AMG(near_nullspace=B))
    assert abs(iterations(A, b, AMG(near_nullspace=B), reorder="rcm") - plain) <= 0.2 * plain
    assert iterations(A, b, "amg") > 2 * plain  # constants only: the rigid body modes matter


@pytest.mark.parametrize("preconditioner", ["chebyshev", "amg"])
def test_tiny_and_empty_systems(preconditioner):
    empty = PCG(sp.csr_matrix((0, 0)), preconditioner=preconditioner, device="cpu").solve(np.zeros(0))
    assert empty.converged and empty.iterations == 0
    one = PCG(sp.csr_matrix([[2.0]]), preconditioner=preconditioner, device="cpu").solve(np.ones(1))
    assert one.converged and one.x == pytest.approx([0.5])


def test_a_matrix_within_the_coarse_size_is_solved_directly():
    A = poisson((8, 8))
    solver = PCG(A, preconditioner=AMG(coarse_size=64), rtol=1e-12, device="cpu")
    assert solver.preconditioner_details["levels"] == [{"rows": 64, "nonzeros": A.nnz}]
    assert solver.solve(np.arange(64.0)).iterations == 1


def test_report_fields_of_each_preconditioner(problems):
    A, B, b = problems["elasticity"]
    cheb = PCG(A, preconditioner=Chebyshev(4), device="cpu")
    assert cheb.preconditioner == "chebyshev" and cheb.preconditioner_details["degree"] == 4
    lo, hi = cheb.preconditioner_details["interval"]
    assert 0 < lo < hi == pytest.approx(1.1 * cheb.preconditioner_details["lambda_max_estimate"])
    amg = PCG(A, preconditioner=AMG(near_nullspace=B), device="cpu")
    details = amg.preconditioner_details
    assert amg.preconditioner == "amg" and details["near_nullspace"] == "3 given vectors"
    assert details["levels"][0] == {"rows": A.shape[0], "nonzeros": A.nnz} and len(details["levels"]) >= 2
    assert 0 < amg.preconditioner_setup_time == details["setup_time_s"] <= amg.setup_time
    labels = [label for label, _ in amg.preconditioner_lines]
    assert labels[:2] == ["amg", "amg cycle"] and labels[2:] == [f"  level {k}" for k in range(len(details["levels"]))]
    assert PCG(A, preconditioner="jacobi", device="cpu").preconditioner_details == {}


# -- the plug-in interface and its refusals -------------------------------------------------------
class ScaledIdentity(Preconditioner):
    """A user's plug-in: ``M^{-1} = I / max(diag A)``, float64 and classic PCG only."""

    name = "scaled-identity"
    variants = {"cpu": ("classic",)}
    dtypes = ("float64",)

    def _setup(self, A):
        self.scale = 1.0 / A.diagonal().max()

    def apply(self, r):
        return self.scale * r


def test_a_user_plug_in_runs_and_its_declaration_is_enforced():
    A = poisson((16, 16))
    b = np.ones(A.shape[0])
    res = PCG(A, preconditioner=ScaledIdentity(), rtol=1e-10, device="cpu", variant="classic").solve(b)
    plain = PCG(A, preconditioner="none", rtol=1e-10, device="cpu").solve(b)
    assert res.converged and res.iterations == plain.iterations  # a scalar multiple does not change CG
    with pytest.raises(InputError, match="'scaled-identity': does not run the single-reduction PCG variant"):
        PCG(A, preconditioner=ScaledIdentity(), device="cpu", variant="single-reduction")
    with pytest.raises(InputError, match="'scaled-identity': does not run in float32"):
        PCG(A, preconditioner=ScaledIdentity(), device="cpu", dtype="float32")


def test_one_options_object_serves_several_solvers():
    spec = Chebyshev(3)
    a = PCG(poisson((10, 10)), preconditioner=spec, device="cpu")
    b = PCG(poisson((30, 30)), preconditioner=spec, device="cpu")
    assert not hasattr(spec, "smoother")  # the options object itself is never set up
    assert a.solve(np.ones(100)).converged and b.solve(np.ones(900)).converged


REFUSED = [  # (PCG arguments, message)
    (dict(preconditioner="amg", device="gpu", variant="single-reduction"),
     r"'amg': does not run the single-reduction PCG variant on the GPU \(it takes classic\)"),
    (dict(preconditioner=Chebyshev(), device="gpu", variant="single-reduction"),
     "'chebyshev': does not run the single-reduction PCG variant on the GPU"),
    (dict(preconditioner=ScaledIdentity(), device="gpu"),
     "'scaled-identity': has no GPU implementation yet; run it with --device cpu"),
    (dict(preconditioner=ScaledIdentity(), mode="while"), "'scaled-identity': has no GPU implementation yet"),
    (dict(preconditioner=AMG(hierarchy_dtype="float64"), device="cpu", dtype="float32"),
     "AMG hierarchy_dtype float64 is more precise than the solver's float32"),
    (dict(preconditioner="ilu"), "unknown preconditioner 'ilu'; choose from none, jacobi, chebyshev, amg"),
    (dict(preconditioner=Jacobi), "unknown preconditioner"),  # the class, not an instance
    (dict(preconditioner="amg", A=spla.aslinearoperator(poisson((8, 8)))), "needs an explicit matrix"),
]


@pytest.mark.parametrize("arguments, message", REFUSED)
def test_unsupported_combinations_are_refused_with_the_reason(arguments, message):
    arguments = dict(arguments)
    A = arguments.pop("A", poisson((8, 8)))
    with pytest.raises(InputError, match=message):
        PCG(A, **arguments)


def test_auto_takes_the_cpu_for_a_cpu_only_preconditioner_and_says_why(monkeypatch):
    import solvers.pcg.solver as solver_module
    monkeypatch.setattr(solver_module, "resolve_device", lambda device: ("gpu", None))  # as on a GPU machine
    solver = PCG(poisson((8, 8)), preconditioner=ScaledIdentity(), variant="classic")
    assert solver.device == "cpu"
    assert solver.device_note == "auto: preconditioner 'scaled-identity' runs on the CPU only so far"


def test_amg_without_pyamg_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyamg", None)  # as if not installed: import fails
    with pytest.raises(InputError, match=r"the amg preconditioner needs PyAMG: pip install 'graphsolve-cuda\[amg\]'"):
        PCG(poisson((8, 8)), preconditioner="amg", device="cpu")


def test_batched_solver_takes_pointwise_preconditioners_only():
    with pytest.raises(InputError, match="preconditioner must be one of jacobi, none, not 'chebyshev'"):
        BatchedPCG([poisson((4, 4))], preconditioner="chebyshev")


BAD_OPTIONS = [
    (lambda: Chebyshev(0), "Chebyshev degree must be an integer >= 1"),
    (lambda: Chebyshev(2.5), "Chebyshev degree must be an integer >= 1"),
    (lambda: Chebyshev(lower_fraction=1.5), "0 < lower_fraction < 1 <= safety"),
    (lambda: AMG(smoother="gauss-seidel"), "AMG smoother must be one of chebyshev, jacobi"),
    (lambda: AMG(coarse_size=0), "AMG coarse size must be an integer from 1 to 4096"),
    (lambda: AMG(coarse_size=5000), "AMG coarse size must be an integer from 1 to 4096"),
    (lambda: AMG(omega=2.5), r"omega must lie in \(0, 2\)"),
    (lambda: AMG(max_levels=1), "AMG max_levels must be an integer >= 2"),
    (lambda: AMG(near_nullspace=np.ones((4, 2, 2))), r"\(n, k\) array with k >= 1"),
    (lambda: AMG(near_nullspace=[[1.0], [np.nan]]), "NaN or Inf"),
    (lambda: AMG(near_nullspace=np.c_[np.ones(5), np.zeros(5)]), "a zero vector"),
    (lambda: AMG(near_nullspace=np.ones((2, 3))), "more vectors"),
    (lambda: AMG(hierarchy_dtype="float16"), "AMG hierarchy_dtype must be None or one of float64, float32"),
    (lambda: PCG(poisson((4, 4)), preconditioner=AMG(near_nullspace=np.ones(15)), device="cpu"),
     "the near-nullspace has 15 rows but the matrix has 16"),
    (lambda: PCG(sp.diags([1.0, -1.0, 2.0]).tocsr(), preconditioner="chebyshev", device="cpu"),
     "Chebyshev preconditioner needs a positive diagonal"),
]


@pytest.mark.parametrize("make, message", BAD_OPTIONS)
def test_bad_options_and_inputs_are_input_errors(make, message):
    with pytest.raises(InputError, match=message):
        make()


def test_cg_function_takes_the_new_names():
    A = rotated_anisotropic_diffusion((32, 32))
    b = np.ones(A.shape[0])
    for name in ("chebyshev", "amg"):
        x, info = solvers.cg(A, b, rtol=1e-8, preconditioner=name)
        assert info == 0 and np.linalg.norm(b - A @ x) <= 1e-8 * np.linalg.norm(b) * 2


def test_the_same_matrix_gives_the_same_hierarchy_and_leaves_the_random_state_alone():
    A = rotated_anisotropic_diffusion((48, 48))
    np.random.seed(7)
    expected = np.random.rand()
    np.random.seed(7)
    first, second = AMG().setup(A), AMG().setup(A)
    assert np.random.rand() == expected
    for a, b in zip(first.levels, second.levels):
        assert (a.P != b.P).nnz == 0 and (a.A != b.A).nnz == 0
    assert np.array_equal(first.coarse_inverse, second.coarse_inverse)


@given(A=spd_matrices(), preconditioner=st.sampled_from(("none", "jacobi", "chebyshev", "amg")),
       variant=st.sampled_from(("classic", "single-reduction")))
@fuzz(60)
def test_random_systems_converge_with_every_preconditioner(A, preconditioner, variant):
    """Random row-length profiles (hub rows, diagonal-only rows, scattered numberings): each preconditioner
    converges to a true residual within the tolerance."""
    b = np.random.default_rng(A.shape[0]).standard_normal(A.shape[0])
    res = PCG(A, preconditioner=preconditioner, variant=variant, rtol=RTOL, maxiter=10 * A.shape[0] + 100,
              device="cpu").solve(b)
    assert res.converged, res.reason.label
    assert np.linalg.norm(b - A @ res.x) <= 2 * RTOL * np.linalg.norm(b)
