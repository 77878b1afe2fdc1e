"""GPU PCG: kernels against their NumPy reference, drivers against each other and the CPU."""
import re

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, strategies as st

import solvers
from solvers.formats import ELL
from solvers.gallery import (anisotropic_diffusion, periodic_poisson, poisson, power_law_laplacian,
                             random_geometric_laplacian, stencil27)
from solvers.mmio import read_matrix
from solvers.pcg.result import Reason
from solvers.pcg.solver import FORMAT_NUMBERING

from fuzzing import fuzz, spd_matrices

pytestmark = pytest.mark.gpu
MODES = ("eager", "graph", "while")


def cases(matrices_dir):
    out = {"poisson2d_48": poisson((48, 48)), "poisson3d_16": poisson((16, 16, 16)),
           "aniso2d_32": anisotropic_diffusion((32, 32), eps=0.01)}
    for name in ("1138_bus.mtx", "lap2D_5pt_n100.mtx", "gr_900_900_crg.mtx", "ginkgo_simple_A.mtx"):
        out[name] = read_matrix(str(matrices_dir / name))
    return out


def assert_run_matches_reference(g, pairs, host, ref):
    """The device vectors (``pairs``: name, array) and state equal the reference's after a launch."""
    from solvers.kernels import pcg_ref
    from solvers.kernels.structs import STATE

    dev = STATE.read(g.state.get())
    for name, got in pairs:
        np.testing.assert_allclose(got.get(), host[name], rtol=1e-11, atol=1e-11, err_msg=name)
    assert dev["status"] == ref["status"] == pcg_ref.RUNNING
    assert dev["iteration"] == ref["iteration"] and dev["parity"] == ref["parity"]
    for key in ("alpha", "beta", "rz", "rz_inv", "pq", "rnorm"):
        assert dev[key] == pytest.approx(ref[key], rel=1e-10), key


def with_long_row(A, length=None):
    """``A`` plus a weak coupling of row 0 to many others: SELL cuts that row into pieces."""
    n = A.shape[0]
    length = length or n - 1
    coupling = sp.coo_matrix((np.full(length, 1e-3), (np.zeros(length, int), np.arange(1, length + 1))),
                             shape=A.shape)
    return (A + coupling + coupling.T).tocsr()


# (matrix format, gather): every kernel configuration the solver can run
CONFIGS = [("dia", "formed"), ("dia", "stored"), ("ell", "formed"), ("ell", "stored"), ("sell", "formed"),
           ("sell", "stored"), ("csr", "formed"), ("csr", "stored")]


def set_state(g, **fields):
    from solvers.kernels.structs import STATE
    st = STATE.pack(**fields)
    g.state.set(np.frombuffer(st.tobytes(), dtype=np.uint8))
    return {k: st[k].item() for k in STATE.dtype.names}


@pytest.mark.parametrize("fmt, gather, held", [c + (None,) for c in CONFIGS] + [("sell", "stored", 1),
                                                                                   ("ell", "stored", 1)])
def test_classic_kernel_matches_numpy_reference(cupy, fmt, gather, held):
    from solvers.kernels import pcg_ref
    from solvers.pcg.gpu import GPUPCG

    A = poisson((20, 30)) + sp.diags(np.linspace(0.1, 1.0, 600))
    A = with_long_row(A.tocsr()) if fmt not in ("dia", "ell") else A.tocsr()
    rng = np.random.default_rng(3)
    g = GPUPCG(A, "jacobi", np.float64, "eager", 1, False, variant="classic", matrix_format=fmt, gather=gather,
               held=held)
    assert g.format.name == fmt and g.gather == gather
    if held is not None:
        assert g.held == held
    else:  # r held wherever a stored gather's kernel stages nothing
        assert bool(g.held) == (gather == "stored" and not g.stage_bytes)
    dinv = 1.0 / A.diagonal()
    host = {k: rng.standard_normal(600) for k in ("p0", "p1", "x", "r")}
    host["z"] = dinv * host["r"]  # z = M^-1 r between iterations (a stored gather keeps no z: it forms it from r)
    assert (g.vectors["z"] is None) == (gather == "stored")
    pairs = tuple((name, g.vectors[name]) for name in ("z", "p0", "p1", "x", "r") if g.vectors[name] is not None)
    for name, dev in pairs:
        dev.set(host[name])
    ref = set_state(g, rz=2.5, beta=0.37, tol=1e-30, maxiter=100, parity=1, iteration=4)

    def reference_iteration():
        q = pcg_ref.direction_product(A, host["z"], host["p0"], host["p1"], ref)
        host["z"] = pcg_ref.pcg_update(host["x"], host["r"], q, host["p0"], host["p1"], dinv, ref)
        return q

    # one iteration a launch, then two and three in one launch (grid reductions between them, both
    # parities, x's late steps taken in a product and at the end of a launch)
    for count in (1, 2, 3):
        for _ in range(count):
            q = reference_iteration()
        g.launch_run(count, np.uint64(0))
        np.testing.assert_allclose(g.vectors["q"].get(), q, rtol=1e-11, atol=1e-11)
        assert_run_matches_reference(g, pairs, host, ref)
        # two grid reductions an iteration, and a barrier before a stored product
        per_iteration = 3 if gather == "stored" else 2
        assert int(g.epoch.get()[0]) == per_iteration * (ref["iteration"] - 4)
        assert int(g.arrivals.get()[0]) == int(g.epoch.get()[0]) * g.grid  # every block arrived at each
    assert ref["iteration"] == 10

    out = cupy.empty(600)
    g.b.set(host["z"])
    g._residual(g.x, out)
    np.testing.assert_allclose(out.get(), pcg_ref.matrix_residual(A, g.x.get(), host["z"]), rtol=1e-12,
                               atol=1e-12)


def test_residual_held_on_chip_gives_the_same_bits(cupy):
    """r held in shared memory for some, all or none of a thread's rows (the rest in global memory), or the
    matrix staged there instead: the same solve, bit for bit."""
    from solvers.pcg.gpu import GPUPCG

    A = poisson((300, 300)).tocsr()
    b = np.random.default_rng(5).standard_normal(A.shape[0])
    runs = {}
    for held in (0, 1, 2, None):
        g = GPUPCG(A, "jacobi", np.float64, "while", 32, True, variant="classic", matrix_format="sell",
                   gather="stored", block=256, held=held)
        rows = -(-A.shape[0] // (g.grid * g.run_block))
        assert rows >= 2  # a thread's second row is in global memory when it holds one
        assert g.held == (held if held is not None else 0) and bool(g.stage_bytes) == (held is None)
        x, reason, iterations, rnorm, history = g.solve(g.check_vector(b, "b"), None, 1e-10, 2000, None, True)
        assert reason == Reason.CONVERGED
        runs[held] = (x.get(), iterations, rnorm, np.asarray(history))
    first = runs[0]
    for held, run in runs.items():
        np.testing.assert_array_equal(run[0], first[0], err_msg=f"held {held}")
        assert run[1:3] == first[1:3]
        np.testing.assert_array_equal(run[3], first[3])


@pytest.mark.parametrize("options", [dict(variant="single-reduction", gather="stored"),
                                     dict(variant="classic", gather="formed"),
                                     dict(variant="classic", gather="stored", preconditioner="chebyshev")])
def test_residual_held_only_by_the_classic_stored_kernel(cupy, options):
    from solvers.errors import InputError
    from solvers.pcg.gpu import GPUPCG

    options = dict(options)
    with pytest.raises(InputError, match="held on chip only by the classic variant"):
        GPUPCG(poisson((20, 20)), options.pop("preconditioner", "jacobi"), np.float64, "eager", 1, False,
               matrix_format="sell", held=1, **options)


@pytest.mark.parametrize("fmt, gather", CONFIGS)
def test_single_reduction_kernel_matches_numpy_reference(cupy, fmt, gather):
    from solvers.kernels import pcg_ref
    from solvers.pcg.gpu import GPUPCG

    A = poisson((20, 30)) + sp.diags(np.linspace(0.1, 1.0, 600))
    A = with_long_row(A.tocsr()) if fmt not in ("dia", "ell") else A.tocsr()
    n = A.shape[0]
    g = GPUPCG(A, "jacobi", np.float64, "eager", 1, False, variant="single-reduction", matrix_format=fmt,
               gather=gather)
    dinv = 1.0 / A.diagonal()
    # the set-up pass (iteration -1, zero p, s, w), then two iterations in one launch (both parities)
    host = {k: np.zeros(n) for k in ("p", "r1", "s0", "s1", "w0", "w1")}
    host["x"] = np.random.default_rng(5).standard_normal(n)
    host["r0"] = np.random.default_rng(6).standard_normal(n)
    pairs = tuple((name, g.vectors[name]) for name in ("x", "p", "r0", "r1", "s0", "s1", "w0", "w1"))
    for name, dev in pairs:
        dev.set(host[name])
    ref = set_state(g, tol=1e-30, maxiter=100, iteration=-1)
    r, s_, w = [host["r0"], host["r1"]], [host["s0"], host["s1"]], [host["w0"], host["w1"]]
    for count in (1, 2):
        for _ in range(count):
            pcg_ref.pcg1_step(A, dinv, host["x"], host["p"], r, s_, w, ref)
        g.launch_run(count, np.uint64(0))
        assert_run_matches_reference(g, pairs, host, ref)
        # one grid reduction an iteration, and a barrier before a stored product
        assert int(g.epoch.get()[0]) == (2 if gather == "stored" else 1) * (ref["iteration"] + 1)
        assert int(g.arrivals.get()[0]) == int(g.epoch.get()[0]) * g.grid
    assert ref["iteration"] == 2 and ref["parity"] == 1


@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
def test_modes_agree_with_each_other_and_cpu(cupy, matrices_dir, variant):
    for name, A in cases(matrices_dir).items():
        b = np.random.default_rng(7).standard_normal(A.shape[0])
        cpu = solvers.PCG(A, device="cpu", rtol=1e-8, maxiter=20 * A.shape[0], variant=variant).solve(b)
        results = {m: solvers.PCG(A, device="gpu", mode=m, rtol=1e-8, maxiter=20 * A.shape[0], unroll=4,
                                  variant=variant, reorder="none").solve(b)
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
    # float32 reaches 1e-4 here (the true residual confirms it); at 1e-5 it stops 4.7 times above.
    r32 = solvers.PCG(A, device="gpu", mode="while", dtype="float32", rtol=1e-4).solve(b)
    r64 = solvers.PCG(A, device="gpu", mode="while", rtol=1e-4).solve(b)
    assert r32.converged and r32.x.dtype == np.float32
    assert abs(r32.iterations - r64.iterations) <= 2
    assert r32.relative_residual < 2e-4
    deep = solvers.PCG(A, device="gpu", mode="while", dtype="float32", rtol=1e-7).solve(b)
    assert deep.reason is Reason.INACCURATE and deep.true_residual_norm > 2 * deep.tolerance


@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
def test_graph_instantiated_once_over_100_solves_and_value_updates(cupy, variant):
    A = poisson((24, 24))
    solver = solvers.PCG(A, device="gpu", mode="while", rtol=1e-10, variant=variant)
    rng = np.random.default_rng(0)
    for k in range(100):
        b = rng.standard_normal(A.shape[0])
        res = solver.solve(cupy.asarray(b))
        assert res.converged
        # the first solve captures the graph (timed apart from the loop), the others reuse it
        assert (res.capture_time > 0) == (k == 0) and 0 < res.loop_time < res.solve_time
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
    small = solvers.PCG(poisson((32, 32)), device="gpu", path="grid")
    side = int(np.sqrt(SINGLE_REDUCTION_MAX_ROWS)) + 1
    large = solvers.PCG(poisson((side, side)), device="gpu")
    assert small.variant == "single-reduction" and large.variant == "classic"
    assert large.solve(np.ones(side * side), maxiter=5).iterations == 5


IRREGULAR = {
    "geometric": lambda: random_geometric_laplacian(6000, seed=1),
    "power_law": lambda: power_law_laplacian(8000, seed=2),  # long rows: pieces on several warps
    "long_row": lambda: with_long_row(poisson((40, 40))),
}


@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
@pytest.mark.parametrize("fmt, gather", CONFIGS)
def test_every_format_and_gather_agrees_across_modes_and_with_cpu(cupy, variant, fmt, gather):
    from solvers.pcg.gpu import GPUPCG
    slots = {"stencil": lambda: stencil27((12, 10, 9)), "torus": lambda: periodic_poisson((40, 40))}  # DIA holds them
    for name, make in {**IRREGULAR, **slots}.items():
        A = make()
        n = A.shape[0]
        if fmt in ("dia", "ell") and (np.diff(A.indptr).max() > 64 or fmt == "dia" and name not in slots):
            with pytest.raises(solvers.InputError, match=f"{fmt.upper()} (needs|holds at most)"):
                GPUPCG(A, "jacobi", np.float64, "while", 4, False, variant, fmt, gather)
            continue
        b = np.random.default_rng(11).standard_normal(n)
        cpu = solvers.PCG(A, device="cpu", rtol=1e-9, variant=variant).solve(b)
        xs, its = {}, {}
        for mode in MODES:
            g = GPUPCG(A, "jacobi", np.float64, mode, 4, False, variant, fmt, gather)
            x, reason, it, _, _ = g.solve(g.check_vector(b, "b"), None, 1e-9 * np.linalg.norm(b), 10 * n, None,
                                          False)
            assert reason is Reason.CONVERGED, (name, mode)
            xs[mode], its[mode] = x, it
            # scheduling does not change the result: the same solve again gives the same bits
            x_again = g.solve(g.check_vector(b, "b"), None, 1e-9 * np.linalg.norm(b), 10 * n, None, False)[0]
            assert cupy.array_equal(x_again, x), (name, mode)
        assert len(set(its.values())) == 1, (name, its)
        assert all(cupy.array_equal(xs[m], xs["while"]) for m in MODES), name
        assert abs(its["while"] - cpu.iterations) <= max(1, int(0.02 * cpu.iterations)), (name, its, cpu.iterations)
        np.testing.assert_allclose(xs["while"].get(), cpu.x, rtol=1e-6, atol=1e-8 * np.abs(cpu.x).max())


@given(A=spd_matrices(max_n=700), variant=st.sampled_from(("classic", "single-reduction")),
       config=st.sampled_from(CONFIGS), path=st.sampled_from(("auto", "grid")))
@fuzz(40)
def test_random_systems_solve_alike_in_every_format_and_mode(cupy, A, variant, config, path):
    """Random row-length profiles (hub rows cut into pieces, diagonal-only rows, scattered numberings): each
    format and gather converges, with the same bits in eager and while mode, to a true residual within the
    tolerance, and so does the public solver (on chip where ``auto`` takes it there)."""
    from solvers.pcg.gpu import GPUPCG
    fmt, gather = config
    n = A.shape[0]
    b = np.random.default_rng(n).standard_normal(n)

    def assert_solves(x):  # the true residual: the tolerance, with room for the recurrence's drift
        assert np.linalg.norm(b - A @ x.get()) <= 1e-9 * np.linalg.norm(b)

    solver = solvers.PCG(A, device="gpu", path=path, rtol=1e-10, maxiter=10 * n + 100)
    res = solver.solve(b)
    assert res.converged, (solver.path, solver.format, res.reason)
    assert_solves(res.x)
    xs, its = {}, {}
    for mode in ("eager", "while"):
        try:
            g = GPUPCG(A, "jacobi", np.float64, mode, 4, False, variant, fmt, gather)
        except solvers.InputError as exc:  # ELL holds rows of 1 to 64 entries, DIA entries on few diagonals
            assert re.search(f"{fmt.upper()} (needs|holds at most)", str(exc)), str(exc)
            assert fmt == "dia" or fmt == "ell" and np.diff(A.indptr).max() > ELL.MAX_WIDTH
            return
        x, reason, its[mode], _, _ = g.solve(g.check_vector(b, "b"), None, 1e-10 * np.linalg.norm(b), 10 * n + 100,
                                             None, False)
        assert reason is Reason.CONVERGED, (mode, g.describe())
        xs[mode] = x
    assert its["eager"] == its["while"] and cupy.array_equal(xs["eager"], xs["while"])
    assert_solves(xs["while"])


@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
@pytest.mark.parametrize("gather", ["formed", "stored"])
def test_sell_slices_staged_in_shared_memory_give_the_same_bits(cupy, variant, gather):
    """All, about half or none of each warp's slices read from shared memory: the same iterates."""
    from solvers.pcg.gpu import GPUPCG
    for name, make in IRREGULAR.items():
        A = make()
        b = np.random.default_rng(12).standard_normal(A.shape[0])
        xs = []
        for share in (1.0, 0.5, 0.0):
            g = GPUPCG(A, "jacobi", np.float64, "while", 4, False, variant, "sell", gather)
            assert g.stage_bytes > 0 and "staged" in g.describe(), name
            g.stage_bytes = int(g.stage_bytes * share)  # before the first launch: a kernel stages what fits
            x, reason, it, _, _ = g.solve(g.check_vector(b, "b"), None, 1e-9 * np.linalg.norm(b), 100, None, False)
            assert reason in (Reason.CONVERGED, Reason.MAX_ITERATIONS) and it > 10, (name, share)
            xs.append(x)
        assert all(cupy.array_equal(x, xs[0]) for x in xs[1:]), name


def test_a_staged_solver_keeps_its_shared_memory_beside_an_unstaged_one_of_the_same_program(cupy):
    """The kernel object is shared by the solvers of one program: a later solver that stages nothing
    must not lower the shared memory an earlier one launches with."""
    small, large = random_geometric_laplacian(50_000, seed=1), random_geometric_laplacian(130_000, seed=1)
    staged = solvers.PCG(small, device="gpu", path="grid", reorder="none", rtol=1e-8)
    unstaged = solvers.PCG(large, device="gpu", path="grid", reorder="none", rtol=1e-8)
    assert "staged" in staged.format and "staged" not in unstaged.format
    assert staged.format.split(", staged")[0].split("(")[0] == unstaged.format.split("(")[0]  # same format
    for solver, A in ((staged, small), (unstaged, large), (staged, small)):
        res = solver.solve(A @ np.ones(A.shape[0]))
        assert res.converged and np.abs(res.x.get() - 1).max() < 1e-5


def test_auto_format_gather_and_reordering_are_reported(cupy):
    A = random_geometric_laplacian(20000, seed=4)
    solver = solvers.PCG(A, device="gpu", rtol=1e-8)
    assert solver.format.startswith("sell") and "gather stored" in solver.format
    assert solver.reordering.startswith(("neighbours after ", "none (")) or solver.reordering == FORMAT_NUMBERING
    b = A @ np.ones(A.shape[0])
    res = solver.solve(b)
    assert res.converged and np.abs(res.x.get() - 1).max() < 1e-5
    stencil = solvers.PCG(poisson((50, 50)), device="gpu", path="grid")
    assert stencil.format.startswith("dia") and "gather formed" in stencil.format
    assert stencil.reordering.startswith("none (local reads")


def test_reordering_decided_on_the_device_as_on_the_host(cupy):
    """A GPU solve uploads a host matrix first and measures its reads there: the same decision and note."""
    import cupyx.scipy.sparse as csp

    from solvers.reorder import choose_reordering, gather_sectors
    for A in (random_geometric_laplacian(20000, seed=4), poisson((60, 60)),
              random_geometric_laplacian(3000, seed=2)[::-1, ::-1].tocsr()):
        device_A = csp.csr_matrix(A)
        assert gather_sectors(device_A.indptr, device_A.indices) == gather_sectors(A.indptr, A.indices)
        host_plan, host_note = choose_reordering(A, "auto", "gpu")
        device_plan, device_note = choose_reordering(device_A, "auto", "gpu")
        assert device_note == host_note
        assert (device_plan is None) == (host_plan is None)
        if host_plan is not None:  # both on the GPU
            np.testing.assert_array_equal(device_plan.order()[0].perm.get(), host_plan.order()[0].perm.get())
        solver = solvers.PCG(A, device="gpu", rtol=1e-8)
        if solver.path == "on-chip":  # no plan is kept there, so none is measured
            assert solver.reordering.startswith("none (auto reorders the grid path")
        else:
            assert solver.reordering == (FORMAT_NUMBERING if solver._impl.numbering is not None else host_note)


@pytest.mark.parametrize("reorder", ["rcm", "neighbours"])
def test_reordering_is_invisible_to_the_caller(cupy, reorder):
    A = random_geometric_laplacian(5000, seed=5)
    b = np.random.default_rng(3).standard_normal(A.shape[0])
    x0 = np.linspace(0, 1, A.shape[0])
    seen = []
    plain = solvers.PCG(A, device="gpu", rtol=1e-10, reorder="none").solve(b, x0)
    solver = solvers.PCG(A, device="gpu", rtol=1e-10, reorder=reorder)
    assert solver.reordering == reorder and solver.reorder_time > 0
    res = solver.solve(b, x0, callback=lambda xk: seen.append(float(xk[7])))
    np.testing.assert_allclose(res.x.get(), plain.x.get(), rtol=1e-7, atol=1e-9)
    assert abs(res.iterations - plain.iterations) <= 2
    assert seen and abs(seen[-1] - float(res.x[7])) < 1e-12  # the callback sees the original numbering


def _pcg(A, **options):
    solver = solvers.PCG(A, rtol=1e-8, device="gpu", **options)
    assert solver.solve(A @ np.ones(A.shape[0])).converged
    return solver


def _columns(A):
    solver = solvers.PCG(A, rtol=1e-8, device="gpu")
    assert solver.solve(np.column_stack([A @ np.ones(A.shape[0])] * 3)).reasons[0] == Reason.CONVERGED
    return solver


def _batched(A):
    solver = solvers.BatchedPCG([A, 2 * A], rtol=1e-8, device="gpu")
    solver.solve(np.ones((2, A.shape[0])))
    return solver


def _md(_):
    from solvers.md import LennardJones, Simulation, VelocityVerlet, lattice_state
    sim = Simulation(lattice_state(cells=(4, 4, 4)), LennardJones(), VelocityVerlet(0.005), device="gpu",
                     mode="while")
    sim.run(10)
    return sim


def _distributed(A):
    from solvers.distributed.solver import DistributedPCG
    solver = DistributedPCG(A.tocsr(), [0, A.shape[0]], None, rtol=1e-8, device="gpu")
    assert solver.solve(A @ np.ones(A.shape[0])).converged
    return solver


# (what is made, how): every kind of object that keeps an engine or device buffers
DROPPED = {"grid, while (sell)": lambda A: _pcg(with_long_row(A), path="grid"),
           "grid, graph": lambda A: _pcg(A, path="grid", mode="graph"),
           "grid, eager": lambda A: _pcg(A, path="grid", mode="eager"),
           "on chip": lambda A: _pcg(A, path="on-chip"),
           "split body (amg, float32 levels)": lambda A: _pcg(poisson((32, 32, 32)), preconditioner="amg"),
           "split body (chebyshev)": lambda A: _pcg(A, preconditioner="chebyshev"),
           "columns at once": _columns, "batched": _batched, "md": _md, "distributed, one rank": _distributed}


@pytest.mark.parametrize("make", DROPPED.values(), ids=DROPPED.keys())
def test_a_dropped_solver_gives_its_device_memory_back_at_once(cupy, make):
    """``del`` frees a solver's device buffers: no reference cycle holds them until Python's cyclic garbage
    collector runs (which counts Python objects, not device memory), so a program that sets solvers up in a
    loop does not grow on the GPU."""
    import gc
    pool = cupy.get_default_memory_pool()
    A = poisson((24, 24))
    gc.collect()
    gc.disable()
    try:
        before = pool.used_bytes()
        made = make(A)
        assert pool.used_bytes() > before
        del made
        assert pool.used_bytes() == before
    finally:
        gc.enable()
