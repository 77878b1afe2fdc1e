"""The smoothed-aggregation set-up built for the GPU (``amg_gpu_setup``), on the host and on the device.

On the host the set-up runs with its kernels' NumPy meaning (``kernels/amg_setup_ref.py``)
and SciPy: the MIS(2) aggregation's defining properties, the tentative prolongator against
PyAMG's ``fit_candidates``, the Galerkin identities, complexities next to PyAMG's, and AMG-PCG
iteration counts against PyAMG's default solver. The GPU tests check each kernel against its
NumPy meaning, the device hierarchy against the host one (the same aggregates, level for level)
and AMG-PCG on the device-built levels.
"""
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph

from solvers.backend import gpu_available
from solvers.errors import DeviceError, InputError
from solvers.gallery import linear_elasticity_2d, poisson, rotated_anisotropic_diffusion
from solvers.kernels import amg_setup_ref
from solvers.pcg import AMG, PCG
from solvers.pcg.preconditioners import amg_gpu_setup
from solvers.pcg.preconditioners.amg_gpu_setup import (aggregate, build_hierarchy, reference_backend,
                                                       tentative_prolongator)

pyamg = pytest.importorskip("pyamg")  # the test extra installs it (CI runs these)

RTOL = 1e-8
HOST = reference_backend()


@pytest.fixture(scope="module")
def problems():
    """``name -> (A, near-nullspace or None, b)`` at sizes that set up and solve in a fraction of a second."""
    A_el, B_el = linear_elasticity_2d((64, 64))
    cases = {"diffusion": (rotated_anisotropic_diffusion((128, 128)), None), "elasticity": (A_el, B_el)}
    return {name: (A, B, np.random.default_rng(0).random(A.shape[0])) for name, (A, B) in cases.items()}


@pytest.fixture
def host_setup(monkeypatch):
    """``AMG(setup="gpu")`` runs its set-up with the host backend (the device's steps in NumPy)."""
    monkeypatch.setattr(amg_gpu_setup, "device_backend", reference_backend)


def random_spd(n, density, seed):
    """A random sparse SPD matrix (diagonally dominant), possibly with isolated rows."""
    rng = np.random.default_rng(seed)
    M = sp.random(n, n, density=density, random_state=rng, data_rvs=lambda k: -rng.random(k))
    M = sp.triu(M, 1)
    M = (M + M.T).tocsr()
    return (M + sp.diags(1.0 - np.asarray(M.sum(axis=1)).ravel())).tocsr()


def pyamg_iterations(A, B, b):
    residuals = []
    ml = pyamg.smoothed_aggregation_solver(A, B=B)
    ml.solve(b, tol=RTOL, accel="cg", maxiter=2000, residuals=residuals)
    return len(residuals) - 1, ml


# -- the aggregation ------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_mis2_aggregation_has_its_defining_properties(seed):
    A = random_spd(300, 0.012, seed)
    strong = HOST.strong_connections(A, A.diagonal(), 0.0)
    roots = np.flatnonzero(amg_setup_ref.key_state(amg_gpu_setup.independent_set(A, strong, HOST))
                           == amg_setup_ref.ROOT)
    aggregates, count = aggregate(A, 0.0, HOST)
    graph = (A - sp.diags(A.diagonal())).astype(bool).astype(int)
    distance = csgraph.shortest_path(graph, unweighted=True)
    isolated = np.asarray(graph.sum(axis=1)).ravel() == 0
    assert 0 < isolated.sum() < 50  # the case has some
    between = distance[np.ix_(roots, roots)]
    assert (between[~np.eye(roots.size, dtype=bool)] >= 3).all()  # independent at distance 2
    assert (distance[roots][:, ~isolated].min(axis=0) <= 2).all()  # maximal: every node within 2 of a root
    assert np.array_equal(aggregates < 0, isolated)  # isolated nodes, and only they, are left out
    assert count == roots.size and np.array_equal(aggregates[roots], np.arange(count))  # numbered in order
    for a, root in enumerate(roots):
        members = np.flatnonzero(aggregates == a)
        assert distance[root, members].max() <= 2
        nearest = distance[np.ix_(members, roots)].min(axis=1)
        assert np.array_equal(distance[root, members], nearest)  # each node joins a nearest root


def test_aggregation_is_deterministic_and_ignores_the_order_of_entries():
    A = rotated_anisotropic_diffusion((40, 40))
    first, count = aggregate(A, 0.0, HOST)
    again, _ = aggregate(A.copy(), 0.0, HOST)
    shuffled = A.copy()
    rng = np.random.default_rng(3)
    for i in range(A.shape[0]):  # permute the entries within every row
        lo, hi = shuffled.indptr[i], shuffled.indptr[i + 1]
        order = lo + rng.permutation(hi - lo)
        shuffled.indices[lo:hi], shuffled.data[lo:hi] = A.indices[order], A.data[order]
    assert np.array_equal(first, again) and np.array_equal(first, aggregate(shuffled, 0.0, HOST)[0])
    assert count > A.shape[0] // 30


def test_strength_threshold_drops_weak_connections():
    A = rotated_anisotropic_diffusion((20, 20))
    d = A.diagonal()
    strong = HOST.strong_connections(A, d, 0.25)
    rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    expected = (A.indices != rows) & (A.data ** 2 >= 0.0625 * np.abs(d[rows] * d[A.indices]))
    assert np.array_equal(strong, expected) and 0 < strong.sum() < (A.indices != rows).sum()
    C = pyamg.strength.symmetric_strength_of_connection(A, theta=0.25)  # PyAMG's own measure, same graph
    C.setdiag(0)
    C.eliminate_zeros()
    assert C.nnz == strong.sum()


# -- the prolongators and the hierarchy -----------------------------------------------------------
@pytest.mark.parametrize("problem", ["diffusion", "elasticity"])
def test_tentative_prolongator_is_pyamgs_fit_candidates(problems, problem):
    A, B, _ = problems[problem]
    B = np.ones((A.shape[0], 1)) if B is None else B
    aggregates, count = aggregate(A, 0.0, HOST)
    T, R = tentative_prolongator(aggregates, count, 1, B, HOST)
    AggOp = sp.csr_matrix((np.ones(A.shape[0]), aggregates, np.arange(A.shape[0] + 1)), shape=(A.shape[0], count))
    T_pyamg, R_pyamg = pyamg.aggregation.fit_candidates(AggOp, B)
    assert abs(T - T_pyamg.tocsr()).max() <= 1e-12
    np.testing.assert_allclose(R, R_pyamg.reshape(-1, B.shape[1]), atol=1e-10)
    np.testing.assert_allclose(T @ R, B, atol=1e-10)  # T reproduces B exactly


@pytest.mark.parametrize("problem", ["diffusion", "elasticity"])
def test_hierarchy_is_galerkin_and_as_complex_as_pyamgs(problems, problem):
    A, B, _ = problems[problem]
    built = build_hierarchy(A, B, HOST, coarse_size=100)
    for A_fine, P, R, A_coarse, rho in zip(built.operators, built.prolongators, built.restrictions,
                                           built.operators[1:], built.spectral_radii):
        assert abs(R - P.T).max() == 0
        assert abs(R @ A_fine @ P - A_coarse).max() <= 1e-12 * abs(A_coarse).max()
        scale = sp.diags(1.0 / np.sqrt(A_fine.diagonal()))  # D^-1 A has the eigenvalues of D^-1/2 A D^-1/2
        largest = sp.linalg.eigsh(scale @ A_fine @ scale, k=1, which="LA", return_eigenvectors=False)[0]
        assert 0.9 * largest <= rho <= largest * (1 + 1e-9)
    assert built.operators[-1].shape[0] <= 100 * (1 if B is None else B.shape[1])
    nnz = [M.nnz for M in built.operators]
    rows = [M.shape[0] for M in built.operators]
    ml = pyamg.smoothed_aggregation_solver(A, B=B, max_coarse=100)
    # MIS(2) aggregates are larger than PyAMG's greedy ones: lower complexities, within 0.1 of PyAMG's
    # (diffusion 128^2: operator 1.106 vs 1.124, grid 1.082 vs 1.128; elasticity 64^2: 1.270 vs 1.285,
    # 1.127 vs 1.201)
    assert ml.operator_complexity() - 0.1 <= sum(nnz) / nnz[0] <= ml.operator_complexity()
    assert ml.grid_complexity() - 0.1 <= sum(rows) / rows[0] <= ml.grid_complexity()
    coarse = built.operators[-1].toarray()
    np.testing.assert_allclose(built.coarse_inverse @ coarse, np.eye(coarse.shape[0]), atol=1e-8)


@pytest.mark.parametrize("problem", ["diffusion", "elasticity"])
def test_amg_pcg_on_the_gpu_hierarchy_within_1_5x_of_pyamg_default(problems, problem, host_setup):
    A, B, b = problems[problem]
    theirs, _ = pyamg_iterations(A, B, b)
    solver = PCG(A, preconditioner=AMG(near_nullspace=B, setup="gpu", coarse_size=100), rtol=RTOL, device="cpu")
    res = solver.solve(b)
    assert res.converged and res.true_residual_norm <= 2 * RTOL * np.linalg.norm(b)
    # seen: diffusion 35 (PyAMG 51), elasticity 13 (PyAMG 10)
    assert res.iterations <= 1.5 * theirs, (res.iterations, theirs)
    details = solver.preconditioner_details
    assert details["hierarchy"].startswith("set up on the GPU") and len(details["levels"]) >= 3
    assert solver.preconditioner_lines[0][1].startswith("smoothed aggregation (GPU set-up), ")


@pytest.mark.parametrize("smoother", ["chebyshev", "jacobi"])
def test_smoothers_take_the_estimate_their_prolongator_was_smoothed_with(problems, host_setup, smoother,
                                                                        monkeypatch):
    """One Lanczos estimate a level: the smoother's rho(D^-1 A) is the set-up's, which is the estimate of its level."""
    from solvers.pcg.preconditioners import smoothers
    from solvers.pcg.preconditioners.spectrum import largest_scaled_eigenvalue

    def second_estimate(*args, **kwargs):
        raise AssertionError("a smoother estimated rho(D^-1 A) again")
    monkeypatch.setattr(smoothers, "largest_scaled_eigenvalue", second_estimate)
    A, B, _ = problems["elasticity"]
    M = AMG(near_nullspace=B, setup="gpu", coarse_size=100, smoother=smoother).setup(A)
    assert len(M.levels) >= 2
    for level in M.levels:
        own = largest_scaled_eigenvalue(level.A, 1.0 / level.A.diagonal())
        assert level.smoother.lambda_max == pytest.approx(own, rel=1e-12)


def test_update_values_keeps_the_aggregation_and_recomputes_the_rest(host_setup):
    A = rotated_anisotropic_diffusion((64, 64))
    A2 = rotated_anisotropic_diffusion((64, 64), epsilon=1e-2, theta=np.pi / 3)
    b = np.ones(A.shape[0])
    solver = PCG(A, preconditioner=AMG(coarse_size=20, setup="gpu"), rtol=RTOL, device="cpu")
    before = [level.aggregates for level in solver._impl.M._reusable]
    coarse_before = solver._impl.M.levels[1].A.toarray()
    solver.update_values(A2)
    after = solver._impl.M
    assert after.aggregation_reused and [level.aggregates for level in after._reusable] == before
    P, R = after.levels[0].P, after.levels[0].R
    assert abs(R @ A2 @ P - after.levels[1].A).max() <= 1e-12 * abs(after.levels[1].A).max()
    assert not np.allclose(after.levels[1].A.toarray(), coarse_before)
    fresh = PCG(A2, preconditioner=AMG(coarse_size=20, setup="gpu"), rtol=RTOL, device="cpu").solve(b)
    res = solver.solve(b)
    assert res.converged and res.iterations <= 1.2 * fresh.iterations
    solver.update_values(poisson((64, 64)))  # a new pattern aggregates again
    assert not solver._impl.M.aggregation_reused and solver.solve(b).converged


def test_float32_levels_and_a_reordering(problems, host_setup):
    A, B, b = problems["elasticity"]
    plain = PCG(A, preconditioner=AMG(near_nullspace=B, setup="gpu"), rtol=RTOL, device="cpu").solve(b)
    reordered = PCG(A, preconditioner=AMG(near_nullspace=B, setup="gpu"), rtol=RTOL, device="cpu",
                    reorder="rcm").solve(b)
    assert reordered.converged and abs(reordered.iterations - plain.iterations) <= 0.2 * plain.iterations
    A = rotated_anisotropic_diffusion((24, 24))  # small enough for float32 to reach rtol 1e-5
    single = PCG(A, preconditioner=AMG(coarse_size=20, setup="gpu"), rtol=1e-5, device="cpu", dtype="float32")
    assert single._impl.M.levels[1].A.dtype == np.float32 and single.solve(np.ones(A.shape[0])).converged
    stored = amg_gpu_setup.build_on_device(A, None, HOST, dtype=np.float32, coarse_size=20)  # float32 levels, float64 A
    assert stored.operators[0] is A and {M.dtype for M in stored.operators[1:] + stored.prolongators} == {
        np.dtype(np.float32)} and stored.coarse_inverse.dtype == np.float32


def test_options_are_checked():
    with pytest.raises(InputError, match="AMG setup must be one of auto, cpu, gpu, not 'tpu'"):
        AMG(setup="tpu")
    with pytest.raises(InputError, match=r"theta must lie in \[0, 1\), got 1.5"):
        AMG(theta=1.5)
    with pytest.raises(InputError, match="AMG needs a positive diagonal"):
        amg_gpu_setup.build_on_device(sp.csr_matrix(-np.eye(3)), None, HOST)
    indefinite = sp.csr_matrix(np.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(InputError, match="coarsest-level operator is not positive definite"):
        amg_gpu_setup.dense_pseudo_inverse(indefinite, HOST)
    semidefinite = sp.csr_matrix(np.diag([2.0, 0.0, 4.0]))  # a dropped unknown: zero row and column
    np.testing.assert_allclose(amg_gpu_setup.dense_pseudo_inverse(semidefinite, HOST), np.diag([0.5, 0.0, 0.25]),
                               rtol=1e-15, atol=0)


@pytest.mark.parametrize("n", [0, 1])
def test_tiny_and_empty_systems(n, host_setup):
    A = sp.csr_matrix(2.0 * np.eye(n))
    res = PCG(A, preconditioner=AMG(setup="gpu"), device="cpu").solve(np.ones(n))
    assert res.converged and np.allclose(res.x, 0.5)


@pytest.mark.skipif(gpu_available(), reason="checks the refusal where there is no GPU")
def test_gpu_setup_without_a_gpu_is_refused():
    with pytest.raises(DeviceError, match="GPU requested but unavailable"):
        PCG(poisson((8, 8)), preconditioner=AMG(setup="gpu"), device="cpu")


# -- on the device --------------------------------------------------------------------------------
@pytest.fixture
def on_gpu(cupy):
    """``(cupy, cupyx.scipy.sparse, the device backend)``."""
    import cupyx.scipy.sparse as csp
    return cupy, csp, amg_gpu_setup.device_backend()


@pytest.mark.gpu
def test_each_kernel_computes_its_numpy_meaning(on_gpu):
    cupy, csp, device = on_gpu
    A = random_spd(2000, 0.003, 1)
    Ad = csp.csr_matrix(A)
    d = A.diagonal()
    for theta in (0.0, 0.3):
        strong = device.strong_connections(Ad, cupy.asarray(d), theta).get().astype(bool)
        assert np.array_equal(strong, HOST.strong_connections(A, d, theta))
    strong = HOST.strong_connections(A, d, 0.0)
    sd = cupy.asarray(strong.astype(np.uint8))
    keys = HOST.mis_initial_keys(A, strong)
    assert np.array_equal(device.mis_initial_keys(Ad, sd).get(), keys)
    reach = HOST.neighbourhood_max(A, strong, HOST.neighbourhood_max(A, strong, keys))
    assert np.array_equal(device.neighbourhood_max(Ad, sd, cupy.asarray(keys)).get(),
                          HOST.neighbourhood_max(A, strong, keys))
    decided = HOST.mis_decide(reach, keys)
    assert np.array_equal(device.mis_decide(cupy.asarray(reach), cupy.asarray(keys)).get(), decided)
    root_number = (np.cumsum(amg_setup_ref.key_state(decided) == amg_setup_ref.ROOT) - 1).astype(np.int32)
    first = HOST.join_roots(A, strong, decided, root_number)
    assert np.array_equal(device.join_roots(Ad, sd, cupy.asarray(decided), cupy.asarray(root_number)).get(), first)
    assert np.array_equal(device.join_neighbours(Ad, sd, cupy.asarray(first)).get(),
                          HOST.join_neighbours(A, strong, first))
    q = np.random.default_rng(2).standard_normal((400, 3))
    q[:5, 2] = q[:5, 0]  # a rank-deficient aggregate: its third column is dropped
    offsets = np.array([0, 5, 17, 100, 101, 400], dtype=np.int32)
    q_device = cupy.asarray(q)
    r_device = device.fit_candidates(cupy.asarray(offsets), q_device, 1e-10)
    r = HOST.fit_candidates(offsets, q, 1e-10)
    np.testing.assert_allclose(q_device.get(), q, atol=1e-12)
    np.testing.assert_allclose(r_device.get(), r, atol=1e-12)
    assert r[0, 2, 2] == 0 and r_device.get()[0, 2, 2] == 0
    aggregates, count = aggregate(A, 0.0, HOST)
    T, _ = tentative_prolongator(aggregates, count, 1, np.ones((A.shape[0], 1)), HOST)
    X = HOST.product(A, T)
    factor = -0.5 / d
    expected = amg_setup_ref.smooth_prolongator(X.indptr, X.indices, X.data, factor, T.indptr, T.indices, T.data)
    Xd = csp.csr_matrix(X)
    device.smooth_prolongator(Xd, cupy.asarray(factor), csp.csr_matrix(T))
    np.testing.assert_allclose(Xd.data.get(), expected, atol=1e-14)


@pytest.mark.gpu
@pytest.mark.parametrize("problem", ["diffusion", "elasticity"])
def test_device_hierarchy_has_the_host_references_aggregates_and_levels(problems, problem, on_gpu):
    cupy, csp, device = on_gpu
    A, B, _ = problems[problem]
    host = build_hierarchy(A, B, HOST, coarse_size=100)
    on_device = build_hierarchy(csp.csr_matrix(A), None if B is None else cupy.asarray(B), device, coarse_size=100)
    assert len(on_device.structure) == len(host.structure)
    for mine, ref in zip(on_device.structure, host.structure):
        assert mine.count == ref.count and np.array_equal(mine.aggregates.get(), ref.aggregates)
    for mine, ref in zip(on_device.operators, host.operators):
        assert (mine.shape, mine.nnz) == (ref.shape, ref.nnz)
        assert abs(mine.get() - ref).max() <= 1e-10 * abs(ref).max()
    np.testing.assert_allclose(on_device.spectral_radii, host.spectral_radii, rtol=1e-10)  # the same start vector
    np.testing.assert_allclose(on_device.coarse_inverse.get(), host.coarse_inverse,
                               atol=1e-8 * np.abs(host.coarse_inverse).max())


@pytest.mark.gpu
@pytest.mark.parametrize("problem", ["diffusion", "elasticity"])
def test_amg_pcg_with_the_device_set_up_within_1_5x_of_pyamg_default(problems, problem):
    A, B, b = problems[problem]
    theirs, _ = pyamg_iterations(A, B, b)
    # coarse_size 100: levels below the finest to check (the default stops 64^2 elasticity at two)
    solver = PCG(A, preconditioner=AMG(near_nullspace=B, setup="gpu", coarse_size=100), rtol=RTOL, device="cpu")
    assert sp.isspmatrix_csr(solver._impl.M.levels[1].A)  # copied back for the CPU cycle
    res = solver.solve(b)
    assert res.converged and res.iterations <= 1.5 * theirs, (res.iterations, theirs)


@pytest.mark.gpu
def test_levels_of_a_device_matrix_stay_on_the_device_and_take_new_values(problems, on_gpu):
    cupy, csp, _ = on_gpu
    A, B, b = problems["elasticity"]
    # auto: the GPU for a matrix there; coarse_size 100 leaves a level between the finest and the coarsest
    M = AMG(near_nullspace=B, hierarchy_dtype="float64", coarse_size=100).setup(csp.csr_matrix(A))
    assert M.details()["hierarchy"].startswith("set up on the GPU")
    assert all(isinstance(m, csp.csr_matrix) for level in M.levels for m in (level.A, level.P, level.R))
    reference = AMG(near_nullspace=B, setup="gpu", coarse_size=100).setup(A)  # the same set-up, levels on the host
    assert M.level_sizes() == reference.level_sizes()
    r = b - A @ np.ones_like(b)
    np.testing.assert_allclose(M.apply(cupy.asarray(r)).get(), reference.apply(r), rtol=1e-8, atol=1e-12)
    A2 = (A * 3.0).tocsr()
    M.update_values(csp.csr_matrix(A2))
    assert M.aggregation_reused
    np.testing.assert_allclose(M.levels[1].A.get().toarray(), 3.0 * reference.levels[1].A.toarray(), rtol=1e-10,
                               atol=1e-12 * abs(reference.levels[1].A).max())
