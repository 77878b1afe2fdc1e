"""GPU PCG: kernels against their NumPy reference, drivers against each other and the CPU."""
import numpy as np
import pytest
import scipy.sparse as sp

import solvers
from solvers.gallery import anisotropic_diffusion, poisson
from solvers.mmio import read_matrix
from solvers.pcg.result import Reason

pytestmark = pytest.mark.gpu
MODES = ("eager", "graph", "while")


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


def cases(matrices_dir):
    out = {"poisson2d_48": poisson((48, 48)), "poisson3d_16": poisson((16, 16, 16)),
           "aniso2d_32": anisotropic_diffusion((32, 32), eps=0.01)}
    for name in ("1138_bus.mtx", "lap2D_5pt_n100.mtx", "gr_900_900_crg.mtx", "ginkgo_simple_A.mtx"):
        out[name] = read_matrix(str(matrices_dir / name))
    return out


def assert_run_matches_reference(g, pairs, host, ref):
    """The device vectors (``pairs``: name, array) and state equal the reference's after a launch."""
    from solvers.kernels import pcg_ref
    from solvers.pcg.gpu import STATE_DTYPE

    dev = g.state.get().view(STATE_DTYPE)[0]
    for name, got in pairs:
        np.testing.assert_allclose(got.get(), host[name], rtol=1e-11, atol=1e-11, err_msg=name)
    assert dev["status"] == ref["status"] == pcg_ref.RUNNING
    assert dev["iteration"] == ref["iteration"] and dev["parity"] == ref["parity"]
    for key in ("alpha", "beta", "rz", "pq", "rnorm"):
        assert dev[key] == pytest.approx(ref[key], rel=1e-10), key


def test_classic_kernel_matches_numpy_reference(cupy):
    from solvers.kernels import pcg_ref
    from solvers.pcg.gpu import STATE_DTYPE, GPUPCG

    A = poisson((20, 30)) + sp.diags(np.linspace(0.1, 1.0, 600))
    A = A.tocsr()
    rng = np.random.default_rng(3)
    g = GPUPCG(A, "jacobi", np.float64, "eager", 1, False, variant="classic")
    host = {k: rng.standard_normal(600) for k in ("z", "p0", "p1", "x", "r")}
    pairs = (("z", g.z), ("p0", g.p0), ("p1", g.p1), ("x", g.x), ("r", g.r))
    for name, dev in pairs:
        dev.set(host[name])
    st = np.zeros(1, STATE_DTYPE)
    st["rz"], st["beta"], st["tol"], st["maxiter"], st["parity"], st["iteration"] = 2.5, 0.37, 1e-30, 100, 1, 4
    g.state.set(st.view(np.uint8))
    ref = {k: st[k][0].item() for k in STATE_DTYPE.names}
    dinv = 1.0 / A.diagonal()

    def reference_iteration():
        q = pcg_ref.direction_product(A, host["z"], host["p0"], host["p1"], ref)
        host["z"] = pcg_ref.pcg_update(host["x"], host["r"], q, host["p0"], host["p1"], dinv, ref)
        return q

    # one iteration a launch, then two in one launch (grid reductions between them, both parities)
    for count in (1, 2):
        for _ in range(count):
            q = reference_iteration()
        g.launch_run(count, np.uint64(0))
        np.testing.assert_allclose(g.q.get(), q, rtol=1e-11, atol=1e-11)
        assert_run_matches_reference(g, pairs, host, ref)
        assert int(g.epoch.get()[0]) == 2 * ref["iteration"] - 8  # two grid reductions an iteration
    assert ref["iteration"] == 7

    out = cupy.empty(600)
    g.b.set(host["z"])
    g._residual(g.x, out)
    np.testing.assert_allclose(out.get(), pcg_ref.matrix_residual(A, g.x.get(), host["z"]), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("csr", [False, True])
def test_single_reduction_kernel_matches_numpy_reference(cupy, csr):
    from solvers.kernels import pcg_ref
    from solvers.pcg.gpu import STATE_DTYPE, GPUPCG

    A = poisson((20, 30)) + sp.diags(np.linspace(0.1, 1.0, 600))
    if csr:  # one long row and column: CSR layout
        coupling = sp.coo_matrix((np.full(59, 1e-3), (np.zeros(59, int), np.arange(1, 60))), shape=A.shape)
        A = A + coupling + coupling.T
    A = A.tocsr()
    n = A.shape[0]
    g = GPUPCG(A, "jacobi", np.float64, "eager", 1, False, variant="single-reduction")
    assert g.layout.format == ("csr" if csr else "ell")
    dinv = 1.0 / A.diagonal()
    # the set-up pass (iteration -1, zero p, s, w), then two iterations in one launch (both parities)
    host = {k: np.zeros(n) for k in ("p", "r1", "s0", "s1", "w0", "w1")}
    host["x"] = np.random.default_rng(5).standard_normal(n)
    host["r0"] = np.random.default_rng(6).standard_normal(n)
    pairs = (("x", g.x), ("p", g.p0), ("r0", g.r), ("r1", g.r1), ("s0", g.s0), ("s1", g.s1), ("w0", g.w0),
             ("w1", g.w1))
    for name, dev in pairs:
        dev.set(host[name])
    st = np.zeros(1, STATE_DTYPE)
    st["tol"], st["maxiter"], st["iteration"] = 1e-30, 100, -1
    g.state.set(st.view(np.uint8))
    ref = {k: st[k][0].item() for k in STATE_DTYPE.names}
    r, s_, w = [host["r0"], host["r1"]], [host["s0"], host["s1"]], [host["w0"], host["w1"]]
    for count in (1, 2):
        for _ in range(count):
            pcg_ref.pcg1_step(A, dinv, host["x"], host["p"], r, s_, w, ref)
        g.launch_run(count, np.uint64(0))
        assert_run_matches_reference(g, pairs, host, ref)
        assert int(g.epoch.get()[0]) == ref["iteration"] + 1  # one grid reduction an iteration
    assert ref["iteration"] == 2 and ref["parity"] == 1


@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
def test_modes_agree_with_each_other_and_cpu(cupy, matrices_dir, variant):
    for name, A in cases(matrices_dir).items():
        b = np.random.default_rng(7).standard_normal(A.shape[0])
        cpu = solvers.PCG(A, device="cpu", rtol=1e-8, maxiter=20 * A.shape[0], variant=variant).solve(b)
        results = {m: solvers.PCG(A, device="gpu", mode=m, rtol=1e-8, maxiter=20 * A.shape[0], unroll=4,
                                  variant=variant).solve(b)
                   for m in MODES}
        its = {m: r.iterations for m, r in results.items()}
        assert len(set(its.values())) == 1, (name, its)
        for m in MODES:
            assert results[m].converged, (name, m)
            # deterministic reductions: the drivers produce the same bits
            assert cupy.array_equal(results[m].x, results["while"].x), (name, m)
        tol = max(1, int(0.02 * cpu.iterations))  # ill-conditioned cases drift by rounding
        assert abs(its["while"] - cpu.iterations) <= tol, (name, its, cpu.iterations)
        err = np.linalg.norm(results["while"].x.get() - cpu.x) / np.linalg.norm(cpu.x)
        assert err < 1e-5, (name, err)
        assert results["while"].relative_residual < 2e-8, name


def test_float32(cupy):
    A = poisson((40, 40))
    b = np.ones(A.shape[0])
    r32 = solvers.PCG(A, device="gpu", mode="while", dtype="float32", rtol=1e-5).solve(b)
    r64 = solvers.PCG(A, device="gpu", mode="while", rtol=1e-5).solve(b)
    assert r32.converged and r32.x.dtype == np.float32
    assert abs(r32.iterations - r64.iterations) <= 2
    assert r32.relative_residual < 1e-4


@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
def test_graph_instantiated_once_over_100_solves_and_value_updates(cupy, variant):
    A = poisson((24, 24))
    solver = solvers.PCG(A, device="gpu", mode="while", rtol=1e-10, variant=variant)
    rng = np.random.default_rng(0)
    for _ in range(100):
        b = rng.standard_normal(A.shape[0])
        res = solver.solve(cupy.asarray(b))
        assert res.converged
    assert solver.instantiations == 1
    solver.update_values(3.0 * A)
    res = solver.solve(np.ones(A.shape[0]))
    ref = sp.linalg.spsolve((3.0 * A).tocsc(), np.ones(A.shape[0]))
    np.testing.assert_allclose(res.x.get(), ref, rtol=1e-8)
    assert solver.instantiations == 1
    B = poisson((24, 24)) + sp.diags([0.5], [2], shape=A.shape) + sp.diags([0.5], [-2], shape=A.shape)
    solver.update_values(B.tocsr())  # new pattern: set up again
    res = solver.solve(np.ones(A.shape[0]))
    assert res.converged and solver.instantiations == 2


def test_graph_mode_reuses_unrolled_graph(cupy):
    A = poisson((24, 24))
    solver = solvers.PCG(A, device="gpu", mode="graph", unroll=5, rtol=1e-10)
    for seed in range(10):
        assert solver.solve(np.random.default_rng(seed).standard_normal(A.shape[0])).converged
    assert solver.instantiations == 1


def test_device_inputs_without_host_round_trip(cupy):
    import cupyx.scipy.sparse as csp
    A = poisson((16, 16))
    b = np.arange(A.shape[0], dtype=float)
    ref = solvers.PCG(A, device="cpu", rtol=1e-10).solve(b).x
    Ad = csp.csr_matrix(A)
    x, info = solvers.cg(Ad, cupy.asarray(b), rtol=1e-10, preconditioner="jacobi")
    assert isinstance(x, cupy.ndarray) and info == 0
    np.testing.assert_allclose(x.get(), ref, rtol=1e-7)
    res = solvers.PCG(cupy.asarray(A.toarray()), rtol=1e-10).solve(cupy.asarray(b))
    np.testing.assert_allclose(res.x.get(), ref, rtol=1e-7)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    tb = torch.as_tensor(b, device="cuda")
    res = solvers.PCG(Ad, rtol=1e-10).solve(tb)
    np.testing.assert_allclose(res.x.get(), ref, rtol=1e-7)


@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
@pytest.mark.parametrize("mode", MODES)
def test_failures_end_device_loop_with_right_reason(cupy, mode, variant):
    A = poisson((16, 16))
    n = A.shape[0]
    b = np.ones(n)
    b[5] = np.nan
    assert solvers.PCG(A, device="gpu", mode=mode, variant=variant).solve(b).reason is Reason.NOT_FINITE
    indef = sp.diags(np.r_[np.ones(n // 2), -np.ones(n - n // 2)]).tocsr() + 0.1 * poisson((16, 16))
    res = solvers.PCG(indef, device="gpu", mode=mode, preconditioner="none", variant=variant).solve(np.ones(n))
    assert res.reason is Reason.BREAKDOWN and res.info < 0
    res = solvers.PCG(A, device="gpu", mode=mode, unroll=3, variant=variant).solve(np.ones(n), maxiter=7)
    assert res.reason is Reason.MAX_ITERATIONS and res.iterations == 7 and res.info == 7
    A_nan = A.copy()
    A_nan.data[3] = np.inf
    with pytest.raises(solvers.InputError, match="NaN or Inf"):
        solvers.PCG(A_nan, device="gpu", mode=mode)


@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
def test_callback_and_history_on_gpu(cupy, variant):
    A = poisson((20, 20))
    calls = []
    solver = solvers.PCG(A, device="gpu", mode="while", record_history=True, variant=variant)
    res = solver.solve(np.ones(A.shape[0]), callback=lambda xk: calls.append(float(xk[0])))
    assert len(calls) == res.iterations and len(res.history) == res.iterations + 1
    cpu = solvers.PCG(A, device="cpu", record_history=True, variant=variant).solve(np.ones(A.shape[0]))
    np.testing.assert_allclose(res.history[:10], cpu.history[:10], rtol=1e-10)


def test_progress_is_fed_while_the_graph_runs(cupy):
    A = anisotropic_diffusion((256, 256), eps=1e-3)
    seen = []
    res = solvers.PCG(A, device="gpu", mode="while", rtol=1e-12, maxiter=30000).solve(
        np.ones(A.shape[0]), progress=lambda it, r: seen.append((it, r)))
    assert seen and seen[-1][0] == res.iterations
    assert any(0 < it < res.iterations for it, _ in seen) or res.solve_time < 0.2


def test_auto_mode_and_cli_on_gpu(cupy, capsys):
    from solvers.pcg.__main__ import main
    for mode in ("auto", "eager", "graph", "while"):
        code = main(["--example", "lap2D_5pt_n100", "--device", "gpu", "--mode", mode])
        out = capsys.readouterr().out
        assert code == 0 and "converged in" in out, out
        assert f"mode {'while' if mode == 'auto' else mode}" in out


@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
def test_initial_guess_and_float32_on_gpu(cupy, variant):
    A = anisotropic_diffusion((30, 30), eps=0.1)
    n = A.shape[0]
    b = np.random.default_rng(9).standard_normal(n)
    x0 = np.linspace(-1, 1, n)
    cpu = solvers.PCG(A, device="cpu", rtol=1e-9, variant=variant).solve(b, x0)
    gpu = solvers.PCG(A, device="gpu", mode="while", rtol=1e-9, variant=variant).solve(b, x0)
    assert gpu.converged and abs(gpu.iterations - cpu.iterations) <= 1
    np.testing.assert_allclose(gpu.x.get(), cpu.x, rtol=1e-6, atol=1e-8)
    r32 = solvers.PCG(A, device="gpu", mode="while", rtol=1e-5, dtype="float32", variant=variant).solve(b)
    assert r32.converged and r32.x.dtype == np.float32 and r32.relative_residual < 1e-4


def test_auto_variant_on_gpu_follows_size(cupy):
    from solvers.pcg.cpu import SINGLE_REDUCTION_MAX_ROWS
    small = solvers.PCG(poisson((32, 32)), device="gpu")
    side = int(np.sqrt(SINGLE_REDUCTION_MAX_ROWS)) + 1
    large = solvers.PCG(poisson((side, side)), device="gpu")
    assert small.variant == "single-reduction" and large.variant == "classic"
    assert large.solve(np.ones(side * side), maxiter=5).iterations == 5
