"""k right-hand sides of one matrix (``b`` of shape (n, k)): each column as if solved alone."""
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

import solvers
from solvers.errors import InputError
from solvers.gallery import poisson, power_law_laplacian, variable_diffusion
from solvers.kernels import multirhs_ref
from solvers.kernels.pcg_ref import RUNNING
from solvers.pcg.result import Reason

MODES = ("eager", "graph", "while")


def diffusion(shape=(12, 10), seed=0):
    return variable_diffusion(np.exp(np.random.default_rng(seed).normal(size=shape)))


def columns(n, k, seed=1):
    return np.random.default_rng(seed).standard_normal((n, k))


def alone(A, b, **options):
    return solvers.PCG(A, **options).solve(b)


# -- CPU -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preconditioner", ["jacobi", "none"])
def test_columns_agree_with_separate_scipy_solves(preconditioner):
    A = diffusion()
    B = columns(A.shape[0], 4)
    res = solvers.PCG(A, preconditioner=preconditioner, rtol=1e-10, device="cpu").solve(B)
    assert res.x.shape == B.shape and res.converged.all() and res.device == "cpu"
    M = sp.diags(1.0 / A.diagonal()) if preconditioner == "jacobi" else None
    for j in range(B.shape[1]):
        ref, info = spla.cg(A, B[:, j], rtol=1e-10, atol=0.0, M=M, maxiter=10_000)
        assert info == 0
        np.testing.assert_allclose(res.x[:, j], ref, rtol=1e-7, atol=1e-9 * np.abs(ref).max())
        one = alone(A, B[:, j], preconditioner=preconditioner, rtol=1e-10, device="cpu")
        assert res.iterations[j] == one.iterations
        np.testing.assert_array_equal(res.x[:, j], one.x)
    assert np.all(res.relative_residuals < 2e-10)


def test_columns_converge_independently():
    A = poisson((16, 16))
    n = A.shape[0]
    B = np.column_stack([np.ones(n), np.zeros(n), A @ np.ones(n), np.random.default_rng(2).standard_normal(n)])
    res = solvers.PCG(A, rtol=1e-9, device="cpu").solve(B)
    assert res.converged.all()
    assert res.iterations[1] == 0 and np.all(res.x[:, 1] == 0)  # a zero column converges at once
    assert len(set(res.iterations.tolist())) >= 3  # each column stops at its own iteration
    res = solvers.PCG(A, rtol=1e-9, device="cpu").solve(B, maxiter=5)
    assert res.reasons[1] is Reason.CONVERGED
    assert [res.reasons[j] for j in (0, 2, 3)] == [Reason.MAX_ITERATIONS] * 3 and np.all(res.iterations[[0, 2, 3]] == 5)


def test_a_nan_column_is_reported_alone_and_the_others_are_untouched():
    A = diffusion()
    B = columns(A.shape[0], 3)
    B[7, 1] = np.nan
    res = solvers.PCG(A, rtol=1e-9, device="cpu").solve(B)
    assert res.reasons[1] is Reason.NOT_FINITE and res.info[1] == -2
    for j in (0, 2):
        assert res.reasons[j] is Reason.CONVERGED
        np.testing.assert_array_equal(res.x[:, j], alone(A, B[:, j], rtol=1e-9, device="cpu").x)


def test_initial_guesses_scaling_and_the_scipy_like_function():
    A = poisson((10, 10))
    n = A.shape[0]
    B = columns(n, 3)
    B[:, 2] *= 2.0**-900  # outside the safe band: this column is scaled, alone
    X0 = columns(n, 3, seed=5)
    X0[:, 2] *= 2.0**-900
    X0_copy = X0.copy()
    res = solvers.PCG(A, rtol=1e-10, device="cpu").solve(B, X0)
    assert np.array_equal(X0, X0_copy) and res.converged.all()
    for j in range(3):
        np.testing.assert_allclose(A @ res.x[:, j], B[:, j], atol=1e-8 * np.linalg.norm(B[:, j]))
    x, info = solvers.pcg.cg(A, B, rtol=1e-10)
    assert x.shape == B.shape and np.array_equal(info, np.zeros(3))
    x1, info1 = solvers.pcg.cg(A, B[:, :1], rtol=1e-10)  # (n, 1): one right-hand side, as in SciPy
    assert x1.shape == (n,) and info1 == 0


def test_unsupported_requests_are_refused_with_a_reason():
    A = poisson((6, 6))
    B = np.ones((36, 2))
    solver = solvers.PCG(A, device="cpu")
    with pytest.raises(InputError, match="callback and progress follow one right-hand side"):
        solver.solve(B, callback=lambda x: None)
    with pytest.raises(InputError, match=r"b has shape \(35, 2\), expected \(36, 2\)"):
        solver.solve(np.ones((35, 2)))
    with pytest.raises(InputError, match=r"x0 has shape \(36, 3\), expected \(36, 2\)"):
        solver.solve(B, np.ones((36, 3)))
    with pytest.raises(InputError, match=r"b has shape \(36, 0\), expected \(36,\)"):
        solver.solve(np.ones((36, 0)))
    with pytest.raises(InputError, match="record_history keeps the residuals of one right-hand side"):
        solvers.PCG(A, device="cpu", record_history=True).solve(B)


def write_system(tmp_path, A, B):
    import scipy.io
    scipy.io.mmwrite(str(tmp_path / "A.mtx"), A)
    np.save(tmp_path / "B.npy", B)
    return tmp_path / "A.mtx", tmp_path / "B.npy"


def test_command_line_takes_an_array_of_right_hand_sides(capsys, tmp_path):
    import json

    from solvers.mmio import read_columns
    from solvers.pcg.__main__ import main
    A = poisson((9, 9))
    B = columns(81, 3)
    matrix, rhs = write_system(tmp_path, A, B)
    for suffix in (".mtx", ".txt", ".npy"):
        out = tmp_path / f"X{suffix}"
        code = main(["--matrix", str(matrix), "--rhs", str(rhs), "--device", "cpu", "--rtol", "1e-10",
                     "--output", str(out), "--json", str(tmp_path / "r.json"), "-v"])
        printed = capsys.readouterr().out
        assert code == 0 and "3 of 3 right-hand sides converged" in printed and "column 2 " in printed
        X = read_columns(str(out), 81)
        assert X.shape == (81, 3)
        np.testing.assert_allclose(A @ X, B, atol=1e-8)
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["right_hand_sides"] == 3 and len(rep["iterations"]) == 3 and max(rep["true_relative_residuals"]) < 2e-10
    np.save(tmp_path / "x0.npy", np.zeros((81, 2)))
    code = main(["--matrix", str(matrix), "--rhs", str(rhs), "--x0", str(tmp_path / "x0.npy"), "--device", "cpu"])
    assert code == 2 and "initial guess has shape (81, 2) but the right-hand side has (81, 3)" in capsys.readouterr().err
    code = main(["--matrix", str(matrix), "--rhs", str(rhs), "--device", "cpu", "--plot", str(tmp_path / "p.png")])
    assert code == 2 and "--plot: follows one right-hand side" in capsys.readouterr().err
    np.save(tmp_path / "bad.npy", np.ones((80, 3)))
    code = main(["--matrix", str(matrix), "--rhs", str(tmp_path / "bad.npy"), "--device", "cpu"])
    assert code == 2 and "got shape (80, 3)" in capsys.readouterr().err


def test_the_distributed_reader_refuses_several_right_hand_sides(tmp_path):
    MPI = pytest.importorskip("mpi4py.MPI")
    from solvers.distributed.problem import read_distributed
    matrix, rhs = write_system(tmp_path, poisson((5, 5)), columns(25, 2))
    with pytest.raises(InputError, match="holds 2 right-hand sides; across ranks one is solved at a time"):
        read_distributed(MPI.COMM_SELF, str(matrix), str(rhs))


def run_reference(A, dinv, B, tol, maxiter):
    """The kernels' NumPy meaning run to the stop: x and the columns' states."""
    n, k = B.shape
    x, r = np.zeros_like(B), B.copy()
    p = [np.zeros_like(B), np.zeros_like(B)]
    states = [dict(rz=0.0, alpha=0.0, beta=0.0, tol=tol[j], rnorm=0.0, pq=0.0, iteration=-1, maxiter=maxiter,
                   status=RUNNING, parity=0) for j in range(k)]
    multirhs_ref.update(A, dinv, x, r, p, states)  # the set-up pass
    while any(s["status"] == RUNNING for s in states):
        multirhs_ref.direction(A, dinv, r, p, states)
        multirhs_ref.update(A, dinv, x, r, p, states)
    return x, states


def test_kernel_reference_is_classic_pcg_on_each_column():
    A = diffusion()
    B = columns(A.shape[0], 3)
    B[:, 1] = 0.0
    B[3, 2] = np.inf
    tol = 1e-9 * np.linalg.norm(B, axis=0)
    x, states = run_reference(A, 1.0 / A.diagonal(), B, np.nan_to_num(tol, posinf=0.0), 500)
    assert [s["status"] for s in states] == [Reason.CONVERGED, Reason.CONVERGED, Reason.NOT_FINITE]
    one = alone(A, B[:, 0], rtol=1e-9, device="cpu")
    assert states[0]["iteration"] == one.iterations
    np.testing.assert_allclose(x[:, 0], one.x, rtol=1e-12, atol=1e-14)
    assert states[1]["iteration"] == 0 and np.all(x[:, 1] == 0)
    np.testing.assert_allclose(multirhs_ref.residual(A, x, B)[:, 0], B[:, 0] - A @ one.x, atol=1e-12)


# -- GPU -------------------------------------------------------------------------------------------
def gpu_solver(A, **options):
    options.setdefault("reorder", "none")
    return solvers.PCG(A, device="gpu", **options)


@pytest.mark.gpu
@pytest.mark.parametrize("matrix, preconditioner", [("diffusion", "jacobi"), ("diffusion", "none"),
                                                    ("power law", "jacobi")])
def test_gpu_columns_agree_with_cpu_and_single_solves(cupy, matrix, preconditioner):
    # a stencil is held as DIA, whose slots the column kernels read with the columns written out; a power-law
    # graph as SELL: as CSR there
    A = diffusion((40, 30)) if matrix == "diffusion" else power_law_laplacian(2000, seed=1)
    B = columns(A.shape[0], 5)
    solver = gpu_solver(A, preconditioner=preconditioner, rtol=1e-9, path="grid")
    assert solver.format.startswith("dia" if matrix == "diffusion" else "sell")
    res = solver.solve(B)
    cpu = solvers.PCG(A, preconditioner=preconditioner, rtol=1e-9, device="cpu").solve(B)
    assert res.device == "gpu" and res.mode == "while" and res.converged.all()
    assert isinstance(res.x, cupy.ndarray) and res.x.shape == B.shape
    x = res.x.get()
    for j in range(B.shape[1]):
        np.testing.assert_allclose(x[:, j], cpu.x[:, j], rtol=1e-6, atol=1e-7 * np.abs(cpu.x[:, j]).max())
        single = gpu_solver(A, preconditioner=preconditioner, rtol=1e-9, variant="classic", path="grid").solve(B[:, j])
        assert abs(int(res.iterations[j]) - single.iterations) <= 1
        # the CPU's sums round differently: without a preconditioner this system's counts drift a little
        assert abs(int(res.iterations[j]) - int(cpu.iterations[j])) <= max(1, 0.02 * cpu.iterations[j])
    np.testing.assert_allclose(res.true_residual_norms, np.linalg.norm(B - A @ x, axis=0), rtol=1e-6)
    assert np.all(res.relative_residuals < 2e-9)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, k", [((20, 18), 3), ((300, 300), 16)])  # the second: several rows a thread
def test_gpu_kernels_match_their_numpy_reference(cupy, shape, k):
    A = diffusion(shape)
    B = columns(A.shape[0], k)
    tol = np.zeros(k)
    for steps in (0, 1, 4):  # rtol 0: each column stops at maxiter
        res = gpu_solver(A, rtol=0.0, path="grid").solve(B, maxiter=steps)
        x, states = run_reference(A, 1.0 / A.diagonal(), B, tol, steps)
        np.testing.assert_allclose(res.x.get(), x, rtol=1e-11, atol=1e-13)
        assert np.all(res.iterations == steps) and all(r is Reason.MAX_ITERATIONS for r in res.reasons)
        np.testing.assert_allclose(res.residual_norms, [s["rnorm"] for s in states], rtol=1e-10)


@pytest.mark.gpu
def test_gpu_modes_give_identical_bits(cupy):
    A = poisson((30, 30))
    B = columns(A.shape[0], 4)
    B[:, 3] *= 1e-3  # another stopping point
    out = {}
    for mode in MODES:
        solver = gpu_solver(A, mode=mode, unroll=4, rtol=1e-9, path="grid")
        res = solver.solve(B)
        assert res.mode == mode and res.converged.all()
        out[mode] = (res.x.get(), res.iterations.copy(), res.residual_norms.copy())
        solver.solve(B)
        assert solver._column_solvers[4].instantiations == (0 if mode == "eager" else 1)
    for mode in MODES[1:]:
        np.testing.assert_array_equal(out[mode][0], out["eager"][0])
        np.testing.assert_array_equal(out[mode][1], out["eager"][1])
        np.testing.assert_array_equal(out[mode][2], out["eager"][2])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_gpu_failing_columns_stay_alone(cupy, mode):
    n = 64
    indefinite = sp.diags(np.r_[np.ones(n // 2), -np.ones(n // 2)]).tocsr() + 0.05 * poisson((8, 8))
    B = np.ones((n, 4)) * np.array([1.0, 2.0, 4.0, 8.0])
    res = gpu_solver(indefinite, preconditioner="none", mode=mode, unroll=3, rtol=1e-9, path="grid").solve(B)
    one = alone(indefinite, B[:, 0], preconditioner="none", rtol=1e-9, device="cpu")
    assert one.reason is Reason.BREAKDOWN
    assert all(r is Reason.BREAKDOWN for r in res.reasons) and np.all(res.info == -1)
    assert np.all(np.abs(res.iterations - one.iterations) <= 1)
    A = poisson((8, 8))
    B = columns(n, 4)
    solver = gpu_solver(A, mode=mode, unroll=3, rtol=1e-10, path="grid")
    clean = solver.solve(B)
    B_nan = B.copy()
    B_nan[5, 2] = np.nan
    res = solver.solve(B_nan)
    assert res.reasons[2] is Reason.NOT_FINITE and res.info[2] == -2
    for j in (0, 1, 3):  # the same kernel, the same per-column sums: the same bits as without the NaN
        assert res.reasons[j] is Reason.CONVERGED and res.iterations[j] == clean.iterations[j]
        np.testing.assert_array_equal(res.x[:, j].get(), clean.x[:, j].get())


@pytest.mark.gpu
def test_gpu_iterations_equal_single_solves_within_one(cupy):
    A = poisson((64, 64))
    B = columns(A.shape[0], 16)
    res = gpu_solver(A, rtol=1e-8, path="grid").solve(cupy.asarray(B))
    assert res.converged.all()
    single = gpu_solver(A, rtol=1e-8, variant="classic", path="grid")
    for j in range(16):
        assert abs(int(res.iterations[j]) - single.solve(B[:, j]).iterations) <= 1


@pytest.mark.gpu
def test_gpu_scaling_initial_guess_float32_and_the_on_chip_solver(cupy):
    A = poisson((12, 12))
    n = A.shape[0]
    B = columns(n, 3)
    scaled = B.copy()
    scaled[:, 1] *= 2.0**-900
    solver = gpu_solver(A, rtol=1e-10)
    assert solver.path == "on-chip"  # the columns run over its matrix all the same
    plain, tiny = solver.solve(B), solver.solve(scaled)
    assert tiny.converged.all() and tiny.iterations[1] == plain.iterations[1]
    np.testing.assert_array_equal(np.ldexp(tiny.x[:, 1].get(), 900), plain.x[:, 1].get())  # exact scaling
    assert tiny.b_norms[1] == pytest.approx(np.linalg.norm(scaled[:, 1]), rel=1e-12)
    X0 = columns(n, 3, seed=9)
    res = solver.solve(B, X0)
    assert res.converged.all()
    np.testing.assert_allclose(A @ res.x.get(), B, atol=1e-8 * np.abs(B).max())
    res32 = gpu_solver(A, dtype="float32", rtol=1e-5, path="grid").solve(B)
    assert res32.converged.all() and res32.x.dtype == np.float32
    reordered = solvers.PCG(A, device="gpu", reorder="rcm", path="grid", rtol=1e-10).solve(B)
    assert reordered.converged.all()
    np.testing.assert_allclose(reordered.x.get(), plain.x.get(), rtol=1e-7, atol=1e-9)


@pytest.mark.gpu
def test_gpu_refuses_what_the_column_kernels_do_not_run(cupy):
    A = poisson((16, 16))
    B = np.ones((256, 2))
    with pytest.raises(InputError, match="Jacobi or no preconditioner, not 'chebyshev'"):
        gpu_solver(A, preconditioner="chebyshev", path="grid").solve(B)
    with pytest.raises(InputError, match="classic PCG on the GPU, not 'single-reduction'"):
        gpu_solver(A, variant="single-reduction", path="grid").solve(B)
    with pytest.raises(InputError, match="at most 256 right-hand sides"):
        gpu_solver(A, path="grid").solve(np.ones((256, 257)))
