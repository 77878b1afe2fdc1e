"""The on-chip kernel on the GPU: PCG's small-system path and batches, against the CPU and each other."""
import itertools

import numpy as np
import pytest
import scipy.sparse as sp

import solvers
from solvers.gallery import poisson, variable_diffusion
from solvers.mmio import read_matrix
from solvers.pcg.result import Reason

pytestmark = pytest.mark.gpu
MODES = ("eager", "graph", "while")


def small_cases(matrices_dir):
    out = {"poisson_64": poisson((64, 64)), "poisson_20": poisson((20, 20)), "poisson_128": poisson((128, 128))}
    for name in ("1138_bus.mtx", "gr_900_900_crg.mtx", "lap2D_5pt_n100.mtx", "ginkgo_simple_A.mtx"):
        out[name] = read_matrix(str(matrices_dir / name))
    return out


def test_auto_takes_the_on_chip_path_for_small_systems_and_says_so(cupy):
    from solvers.pcg.onchip import ONCHIP_MAX_ROWS, SPREAD_MAX_ROWS
    small = solvers.PCG(poisson((32, 32)), device="gpu")
    assert small.path == "on-chip" and "on chip" in small.format and "rows <=" in small.path_note
    assert small.variant == "classic"  # one block, whole rows in registers (auto_variant)
    cluster = solvers.PCG(poisson((64, 64)), device="gpu")
    assert cluster.variant == "single-reduction" and "cluster of 16 blocks of 256 threads" in cluster.format
    side = int(np.sqrt(ONCHIP_MAX_ROWS)) + 1  # above one cluster: single-reduction over several
    spread = solvers.PCG(poisson((side, side)), device="gpu")
    assert spread.path == "on-chip" and spread.variant == "single-reduction" and "2 clusters of 16" in spread.format
    assert "inside 2 clusters" in spread.path_note
    classic = solvers.PCG(poisson((side, side)), device="gpu", variant="classic")
    assert classic.path == "grid" and "inside one cluster" in classic.path_note
    side = int(np.sqrt(SPREAD_MAX_ROWS)) + 1
    assert solvers.PCG(poisson((side, side)), device="gpu").path == "grid"
    single = solvers.PCG(poisson((32, 32)), device="gpu", variant="single-reduction")
    assert single.path == "on-chip" and single.variant == "single-reduction"
    # 65,536 rows: single-reduction over 7 clusters, classic inside one
    assert "7 clusters of 16 blocks of 608" in solvers.PCG(poisson((256, 256)), device="gpu").format
    assert "a cluster of 16" in solvers.PCG(poisson((256, 256)), device="gpu", path="on-chip",
                                            variant="classic").format
    with pytest.raises(solvers.InputError, match="path must be one of"):
        solvers.PCG(poisson((8, 8)), device="gpu", path="cluster")


@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
def test_on_chip_modes_and_launch_sizes_give_the_same_bits_and_agree_with_cpu(cupy, matrices_dir, variant):
    for name, A in small_cases(matrices_dir).items():
        n = A.shape[0]
        b = np.random.default_rng(3).standard_normal(n)
        cpu = solvers.PCG(A, device="cpu", rtol=1e-8, maxiter=20 * n, variant=variant).solve(b)
        runs = {(m, u): solvers.PCG(A, device="gpu", path="on-chip", mode=m, unroll=u, rtol=1e-8, maxiter=20 * n,
                                    reorder="none", variant=variant).solve(b)
                for m in MODES for u in (1, 7, 4096)}
        ref = runs[("while", 4096)]
        assert ref.converged and ref.relative_residual < 2e-8, name
        for key, res in runs.items():  # a launch resumes exactly where the last one stopped
            assert res.iterations == ref.iterations and cupy.array_equal(res.x, ref.x), (name, key)
        assert abs(ref.iterations - cpu.iterations) <= max(1, int(0.02 * cpu.iterations)), (name, ref.iterations,
                                                                                          cpu.iterations)
        err = np.linalg.norm(ref.x.get() - cpu.x) / np.linalg.norm(cpu.x)
        assert err < 1e-5, (name, err)


@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
def test_on_chip_iterations_follow_the_numpy_reference(cupy, matrices_dir, variant):
    from solvers.kernels.onchip_ref import solve_system
    # one block with the matrix in registers and shared memory; clusters of 8 and 16 blocks
    cases = {"1138_bus": read_matrix(str(matrices_dir / "1138_bus.mtx")), "poisson_64": poisson((64, 64)),
             "poisson_128": poisson((128, 128))}
    for name, A in cases.items():
        n = A.shape[0]
        b = np.random.default_rng(6).standard_normal(n)
        x0 = np.random.default_rng(7).standard_normal(n)
        solver = solvers.PCG(A, device="gpu", path="on-chip", variant=variant, rtol=0.0, maxiter=30, reorder="none")
        # 1138_bus: its rows laid out by length (the kernel's slots, invisible in b, x0 and x)
        assert ("rows by length" in solver.format) == (name == "1138_bus"), (name, solver.format)
        res = solver.solve(b, x0)
        x = x0.copy()
        code, its, rnorm = solve_system(A.tocsr(), 1.0 / A.diagonal(), b, x, 0.0, 30, variant)
        assert res.reason is Reason(code) is Reason.MAX_ITERATIONS and res.iterations == its == 30, name
        np.testing.assert_allclose(res.x.get(), x, rtol=1e-9, atol=1e-12 * np.abs(x).max(), err_msg=name)


def test_long_rows_shared_with_other_lanes_follow_the_numpy_reference(cupy):
    """Rows longer than a slice's width give pieces to lanes of their warp that have no entry in the
    slice (kernels/onchip.cu's share_slice): two long rows in one warp, a row of 400 entries (classic:
    4 held, its warp's slice 21 steps wide instead of 400), long rows in each of a thread's rows."""
    from solvers.kernels.onchip_ref import solve_system
    base = variable_diffusion(np.exp(np.random.default_rng(11).normal(size=(600, 2))))  # 1,200 rows of 3 or 4
    edges = [(5, j) for j in range(100, 140)] + [(9, j) for j in range(200, 230)] + \
        [(700, j) for j in range(300, 321)] + [(1100, j) for j in range(0, 400)] + [(40, 41), (40, 900)]
    rows, cols = np.array(edges).T
    E = sp.coo_matrix((np.full(rows.size, 0.3), (rows, cols)), shape=base.shape).tocsr()
    E = E + E.T
    A = (base + sp.diags(np.asarray(E.sum(axis=1)).ravel()) - E).tocsr()
    n = A.shape[0]
    b = np.random.default_rng(12).standard_normal(n)
    x0 = np.random.default_rng(13).standard_normal(n)
    for variant in ("classic", "single-reduction"):
        runs = {(mode, unroll): solvers.PCG(A, device="gpu", path="on-chip", variant=variant, rtol=0.0, maxiter=25,
                                            reorder="none", mode=mode, unroll=unroll).solve(b, x0)
                for mode in MODES for unroll in (1, 7, 4096)}
        ref = runs[("while", 4096)]
        for key, res in runs.items():
            assert res.iterations == 25 and cupy.array_equal(res.x, ref.x), (variant, key)
        x = x0.copy()
        code, its, _ = solve_system(A, 1.0 / A.diagonal(), b, x, 0.0, 25, variant)
        assert its == 25
        np.testing.assert_allclose(ref.x.get(), x, rtol=1e-9, atol=1e-12 * np.abs(x).max(), err_msg=variant)
    solver = solvers.PCG(A, device="gpu", path="on-chip", reorder="none")
    assert "entries a row in registers, the rest" in solver.format  # held entries and slices: the sharing's case


@pytest.mark.parametrize("shape", [(256, 4, 1), (192, 6, 1), (256, 2, 8), (128, 4, 8), (256, 4, 16), (256, 3, 14)])
def test_other_on_chip_layouts_follow_the_numpy_reference(cupy, monkeypatch, shape):
    from solvers.kernels.onchip_ref import solve_system
    from solvers.pcg import onchip
    monkeypatch.setattr(onchip, "latency_shape", lambda rows, pattern=None, spread=True: onchip.Shape(*shape))
    block, rows, team = shape
    n = block * rows * team - 37  # the last block's last rows absent
    A = variable_diffusion(np.exp(np.random.default_rng(8).normal(size=(n // 50, 50))))
    A = (A + sp.diags(np.ones(A.shape[0]), 0)).tocsr()
    n = A.shape[0]
    b = np.random.default_rng(9).standard_normal(n)
    for variant in ("classic", "single-reduction"):
        solver = solvers.PCG(A, device="gpu", path="on-chip", variant=variant, rtol=0.0, maxiter=25, reorder="none")
        assert solver.format.startswith(f"on chip: {onchip.Shape(*shape).describe()}")
        res = solver.solve(b)
        x = np.zeros(n)
        code, its, _ = solve_system(A, 1.0 / A.diagonal(), b, x, 0.0, 25, variant)
        assert res.iterations == its == 25, (shape, variant)
        np.testing.assert_allclose(res.x.get(), x, rtol=1e-9, atol=1e-12 * np.abs(x).max(), err_msg=str(shape))


def test_on_chip_cluster_with_the_matrix_in_global_memory(cupy):
    A = poisson((200, 200))  # 40,000 rows: a cluster of 14 blocks (non-portable), the matrix too large for shared memory
    solver = solvers.PCG(A, device="gpu", path="on-chip", rtol=1e-9, variant="classic")
    assert "cluster of 14" in solver.format and "global" in solver.format
    b = np.random.default_rng(4).standard_normal(A.shape[0])
    res = solver.solve(b)
    cpu = solvers.PCG(A, device="cpu", rtol=1e-9, variant=solver.variant).solve(b)
    assert res.converged and abs(res.iterations - cpu.iterations) <= 3
    np.testing.assert_allclose(res.x.get(), cpu.x, rtol=1e-6, atol=1e-9 * np.abs(cpu.x).max())
    for mode in ("eager", "graph"):  # the workspace built once a solve, resumed from between launches
        again = solvers.PCG(A, device="gpu", path="on-chip", rtol=1e-9, mode=mode, unroll=64,
                            variant="classic").solve(b)
        assert again.iterations == res.iterations and cupy.array_equal(again.x, res.x), mode


@pytest.mark.parametrize("shape", [(128, 1, 4, 3), (256, 2, 8, 2), (96, 3, 16, 2)])
def test_a_system_spread_over_clusters_follows_the_numpy_reference(cupy, monkeypatch, shape):
    from solvers.kernels.onchip_ref import solve_system
    from solvers.pcg import onchip
    monkeypatch.setattr(onchip, "latency_shape", lambda rows, pattern=None, spread=True: onchip.Shape(*shape))
    block, rows, team, groups = shape
    n = block * rows * team * groups - 37  # the last block's last rows absent
    A = variable_diffusion(np.exp(np.random.default_rng(8).normal(size=(n // 50, 50))))
    A = (A + sp.diags(np.ones(A.shape[0]), 0)).tocsr()
    n = A.shape[0]
    b = np.random.default_rng(9).standard_normal(n)
    x0 = np.random.default_rng(10).standard_normal(n)
    solvers_ = {(m, u): solvers.PCG(A, device="gpu", path="on-chip", variant="single-reduction", rtol=0.0, maxiter=25,
                                    reorder="none", mode=m, unroll=u) for m in MODES for u in (1, 7, 4096)}
    runs = {key: solver.solve(b, x0) for key, solver in solvers_.items()}
    ref = runs[("while", 4096)]
    assert solvers_[("while", 4096)].format.startswith(f"on chip: {onchip.Shape(*shape).describe()}")
    for key, res in runs.items():  # launches resume exactly, the teams' counter running on between them
        assert res.iterations == 25 and cupy.array_equal(res.x, ref.x), (shape, key)
    x = x0.copy()
    code, its, _ = solve_system(A, 1.0 / A.diagonal(), b, x, 0.0, 25, "single-reduction")
    assert its == 25
    np.testing.assert_allclose(ref.x.get(), x, rtol=1e-9, atol=1e-12 * np.abs(x).max(), err_msg=str(shape))
    # the kernel's own true residual at the end reads x across teams
    kernel_norm = float(solvers_[("while", 4096)]._impl.norms[0].get())
    assert abs(kernel_norm - np.linalg.norm(b - A @ x)) <= 1e-9 * np.linalg.norm(b)


def test_poisson_256_spread_over_seven_clusters_agrees_with_the_cpu(cupy):
    A = poisson((256, 256))
    b = np.random.default_rng(5).standard_normal(A.shape[0])
    solver = solvers.PCG(A, device="gpu", rtol=1e-8)
    assert solver.path == "on-chip" and "7 clusters" in solver.format
    res = solver.solve(b)
    cpu = solvers.PCG(A, device="cpu", rtol=1e-8, variant="single-reduction").solve(b)
    assert res.converged and abs(res.iterations - cpu.iterations) <= max(2, cpu.iterations // 100)
    np.testing.assert_allclose(res.x.get(), cpu.x, rtol=1e-6, atol=1e-9 * np.abs(cpu.x).max())
    again = solver.solve(b)  # the same bits a second time (the counter goes on from the first solve)
    assert again.iterations == res.iterations and cupy.array_equal(again.x, res.x)


def test_a_gpu_holding_too_few_clusters_at_once_takes_the_grid_or_refuses(cupy, monkeypatch):
    from solvers.pcg import onchip
    monkeypatch.setattr(onchip, "resident_clusters", lambda function, shape, shared_bytes: shape.groups - 1)
    A = poisson((256, 256))
    solver = solvers.PCG(A, device="gpu")
    assert solver.path == "grid" and "holds 6 clusters of 16 blocks at once" in solver.path_note
    assert solver.solve(np.ones(A.shape[0])).converged
    with pytest.raises(solvers.DeviceError, match="needs 7"):
        solvers.PCG(A, device="gpu", path="on-chip")


def test_on_chip_failures_history_and_callback(cupy):
    A = poisson((16, 16))
    n = A.shape[0]
    for mode, variant in itertools.product(MODES, ("classic", "single-reduction")):
        on_chip = dict(device="gpu", path="on-chip", mode=mode, variant=variant)
        b = np.ones(n)
        b[5] = np.nan
        assert solvers.PCG(A, **on_chip).solve(b).reason is Reason.NOT_FINITE
        indef = sp.diags(np.r_[np.ones(n // 2), -np.ones(n - n // 2)]).tocsr() + 0.1 * A
        res = solvers.PCG(indef, preconditioner="none", **on_chip).solve(np.ones(n))
        assert res.reason is Reason.BREAKDOWN
        res = solvers.PCG(A, unroll=3, **on_chip).solve(np.ones(n), maxiter=7)
        assert res.reason is Reason.MAX_ITERATIONS and res.iterations == 7
    calls = []
    solver = solvers.PCG(A, device="gpu", path="on-chip", record_history=True)
    res = solver.solve(np.ones(n), callback=lambda xk: calls.append(float(xk[0])))
    plain = solver.solve(np.ones(n))
    assert len(calls) == res.iterations and len(res.history) == res.iterations + 1
    assert cupy.array_equal(res.x, plain.x) and calls[-1] == float(plain.x[0])
    cpu = solvers.PCG(A, device="cpu", record_history=True, variant=solver.variant).solve(np.ones(n))
    np.testing.assert_allclose(res.history[:10], cpu.history[:10], rtol=1e-10)


def diffusion_values(count, side, seed):
    rng = np.random.default_rng(seed)
    pattern = variable_diffusion(np.ones((side, side)))
    values = np.array([variable_diffusion(np.exp(rng.normal(size=(side, side)))).data for _ in range(count)])
    return pattern, values


def test_batch_from_device_arrays_stays_on_device_and_matches_cpu(cupy):
    pattern, values = diffusion_values(300, 16, seed=1)
    b = np.random.default_rng(2).standard_normal((300, 256))
    b[17, 3] = np.nan
    gpu = solvers.BatchedPCG.from_pattern(pattern, values, rtol=1e-9, device="gpu")
    assert "on chip: one block" in gpu.path and "shared" in gpu.path
    res = gpu.solve(cupy.asarray(b))
    cpu = solvers.BatchedPCG.from_pattern(pattern, values, rtol=1e-9, device="cpu").solve(b)
    assert isinstance(res.x, cupy.ndarray) and res.x.shape == (300, 256)
    assert res.reasons == cpu.reasons and res.reasons[17] is Reason.NOT_FINITE
    ok = np.arange(300) != 17
    assert np.all(np.abs(res.iterations[ok] - cpu.iterations[ok]) <= 2)
    np.testing.assert_allclose(res.b_norms[ok], cpu.b_norms[ok], rtol=1e-13)
    np.testing.assert_allclose(res.tolerances[ok], cpu.tolerances[ok], rtol=1e-13)
    np.testing.assert_allclose(res.true_residual_norms[ok], np.linalg.norm(
        b[ok] - np.stack([sp.csr_matrix((values[s], pattern.indices, pattern.indptr)) @ res.x[s].get()
                          for s in np.nonzero(ok)[0]]), axis=1), rtol=1e-6)
    err = np.linalg.norm(res.x.get()[ok] - cpu.x[ok], axis=1) / np.linalg.norm(cpu.x[ok], axis=1)
    assert err.max() < 1e-6
    x0 = cpu.x + 1e-3
    again = gpu.solve(b, x0)
    assert np.all(again.iterations[ok] < res.iterations[ok])


def test_batch_of_large_systems_runs_one_cluster_a_system(cupy):
    mats = [poisson((60, 60)), variable_diffusion(np.exp(np.random.default_rng(5).normal(size=(50, 70))))]
    b = [np.ones(3600), np.linspace(-1, 1, 3500)]
    gpu = solvers.BatchedPCG(mats, rtol=1e-10, device="gpu")
    assert "cluster" in gpu.path
    res = gpu.solve(b)
    cpu = solvers.BatchedPCG(mats, rtol=1e-10, device="cpu").solve(b)
    assert res.converged.all() and isinstance(res.x, list)
    for s in range(2):
        np.testing.assert_allclose(res.x[s].get(), cpu.x[s], rtol=1e-7, atol=1e-10)


def load_example(name):
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / name
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", ["on-chip", "grid"])
def test_a_time_step_captured_into_one_graph_matches_the_cpu(cupy, monkeypatch, path):
    heat = load_example("heat_implicit.py")
    captures = []
    end_capture = cupy.cuda.Stream.end_capture
    monkeypatch.setattr(cupy.cuda.Stream, "end_capture", lambda self: captures.append(1) or end_capture(self))
    m, steps = 40, 12
    A, u0 = heat.step_matrix(m, 2e-3), heat.initial_field(m)
    original = solvers.PCG

    def with_path(*args, **kwargs):
        return original(*args, path=path, **kwargs) if kwargs.get("device") == "gpu" else original(*args, **kwargs)
    monkeypatch.setattr(solvers, "PCG", with_path)
    replay, stream, solver, u = heat.captured_step(A, u0, 1e-10)
    assert solver.path == path
    for _ in range(steps):
        replay()
    stream.synchronize()
    assert len(captures) == 1 and solver.instantiations == 0  # one graph, the caller's; none of the solver's
    reason, iterations, rnorm, tol = solver.enqueued_result()
    assert reason is Reason.CONVERGED and 0 < iterations and rnorm <= tol
    ref = u0.copy()
    cpu = original(A, rtol=1e-10, device="cpu")
    for _ in range(steps):
        ref = cpu.solve(ref, x0=ref).x
    np.testing.assert_allclose(u.get(), ref, rtol=1e-8, atol=1e-10 * np.abs(ref).max())


def test_enqueue_refuses_what_a_capture_cannot_hold(cupy):
    A = poisson((10, 10))
    solver = solvers.PCG(A, device="gpu", reorder="none")
    b = cupy.ones(100)
    with pytest.raises(solvers.InputError, match="contiguous CuPy vector"):
        solver.enqueue(b.astype(cupy.float32), cupy.empty(100))
    with pytest.raises(solvers.InputError, match="without record_history"):
        solvers.PCG(A, device="gpu", record_history=True).enqueue(b, cupy.empty(100))
    out = cupy.empty(100)
    solver.enqueue(b, out)  # outside a capture it simply runs
    cupy.cuda.get_current_stream().synchronize()
    assert solver.enqueued_result()[0] is Reason.CONVERGED
    np.testing.assert_allclose(A @ out.get(), np.ones(100), atol=1e-3)
