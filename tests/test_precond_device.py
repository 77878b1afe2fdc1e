"""The GPU apply of Chebyshev and AMG: the launch sequence, its kernels, and AMG-PCG on the GPU.

The first tests need no GPU: they replay the sequence of launches a preconditioner
lays out (``device_apply``) with the kernels' NumPy meaning (``kernels/precond_ref.py``)
and compare it with the CPU apply, so the cycle's structure is checked everywhere.
The GPU tests compare the kernels with their reference, the GPU solves with the
CPU ones and with PyAMG, and the three drivers with each other, on the problems of
``test_preconditioners.py`` (rtol 1e-8).
"""
import pathlib

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, strategies as st

from solvers.gallery import linear_elasticity_2d, rotated_anisotropic_diffusion
from solvers.kernels import precond_ref
from solvers.pcg import AMG, PCG, Chebyshev, Preconditioner

from fuzzing import fuzz, spd_matrices

pyamg = pytest.importorskip("pyamg")

RTOL = 1e-8
EXAMPLE = str(pathlib.Path(__file__).resolve().parent.parent / "examples" / "data" / "lap2D_5pt_n100.mtx")


@pytest.fixture(scope="module")
def problems():
    """``name -> (A, near-nullspace or None, b)``."""
    A_el, B_el = linear_elasticity_2d((64, 64))
    cases = {"diffusion": (rotated_anisotropic_diffusion((128, 128)), None), "elasticity": (A_el, B_el)}
    return {name: (A, B, np.random.default_rng(0).random(A.shape[0])) for name, (A, B) in cases.items()}


class HostProgram:
    """:class:`~solvers.pcg.preconditioners.device.DeviceProgram`'s interface over NumPy arrays: each
    launch is recorded as its kernel's NumPy meaning and replayed by :meth:`launch`."""

    def __init__(self, r, z, dtype, converted=None):
        self.dtype = np.dtype(dtype)
        self.input = np.zeros(r.size, self.dtype) if converted is None else converted
        self.output = np.zeros(r.size, self.dtype)
        self._r, self._z, self._scratch = r, z, {}
        # with ``converted`` the caller keeps r in the program's precision there (the split update does)
        self._steps = [] if converted is not None else [lambda: self.input.__setitem__(slice(None), self._r)]
        self.kernels = []

    def matrix(self, M):
        return sp.csr_matrix(M, dtype=self.dtype) if sp.issparse(M) else np.asarray(M, dtype=self.dtype)

    def vector(self, v):
        return np.asarray(v, dtype=self.dtype)

    def scratch(self, owner, name, n):
        return self._scratch.setdefault((id(owner), name), np.zeros(n, self.dtype))

    def _add(self, name, step):
        self.kernels.append(name)
        self._steps.append(step)

    def section(self, label):
        import contextlib
        return contextlib.nullcontext()

    def axpby(self, M, v, y, out, a=1.0, c=1.0):
        self._add("axpby", lambda: out.__setitem__(slice(None), precond_ref.axpby(M, v, y, a, c)))

    def chebyshev_begin(self, b, dinv, first, x, d, rs):
        def step():
            d[:], rs[:] = precond_ref.chebyshev_begin(b, dinv, first, x)
        self._add("chebyshev_begin", step)

    def chebyshev_residual(self, A, x, b, dinv, first, d, rs, x_out=None):
        assert x_out is not x  # the kernel's product reads x at neighbouring rows

        def step():
            d[:], rs[:] = precond_ref.chebyshev_residual(A, x, b, dinv, first, x_out)
        self._add("chebyshev_residual", step)

    def chebyshev_start_step(self, A, b, dinv, first, d_new, rs, x, c1, c2):
        def step():
            d_new[:], rs[:] = precond_ref.chebyshev_start_step(A, b, dinv, first, x, c1, c2)
        self._add("chebyshev_start_step", step)

    def chebyshev_step(self, A, dinv, d_old, d_new, rs, x_in, x_out, c1, c2, add_old=False):
        assert d_new is not d_old
        self._add("chebyshev_step", lambda: d_new.__setitem__(
            slice(None), precond_ref.chebyshev_step(A, dinv, d_old, rs, x_in, x_out, c1, c2, add_old)))

    def jacobi_sweep(self, A, y, b, s, out):
        assert out is not y
        self._add("jacobi_sweep", lambda: out.__setitem__(slice(None), precond_ref.jacobi_sweep(A, y, b, s)))

    def scaled_add(self, s, v, x, accumulate):
        self._add("scaled_add", lambda: precond_ref.scaled_add(s, v, x, accumulate))

    def close(self):
        self._steps.append(lambda: self._z.__setitem__(slice(None), self.output))
        return self

    def launch(self):
        for step in self._steps:
            step()


def replayed(M, r):
    z = np.zeros_like(r)
    program = HostProgram(r, z, M.storage_dtype)
    M.device_apply(program)
    program.close().launch()
    return z, program


PRECONDITIONERS = {
    "chebyshev 3": lambda B: Chebyshev(3),
    "chebyshev 1": lambda B: Chebyshev(1),
    "amg chebyshev": lambda B: AMG(near_nullspace=B),
    "amg jacobi x2": lambda B: AMG(near_nullspace=B, smoother="jacobi", sweeps=2),
    "amg jacobi, 2 levels": lambda B: AMG(near_nullspace=B, smoother="jacobi", max_levels=2, coarse_size=4096),
    "amg float32 hierarchy": lambda B: AMG(near_nullspace=B, hierarchy_dtype="float32"),
}


@pytest.mark.parametrize("problem", ["diffusion", "elasticity"])
@pytest.mark.parametrize("name", sorted(PRECONDITIONERS))
def test_the_launch_sequence_does_what_the_cpu_apply_does(problems, problem, name):
    A, B, r = problems[problem]
    M = PRECONDITIONERS[name](B).setup(A)
    z, program = replayed(M, r)
    expected = M.apply(r)
    tolerance = 1e-5 if M.storage_dtype == np.float32 else 1e-12
    assert np.linalg.norm(z - expected) <= tolerance * np.linalg.norm(expected)
    if isinstance(M, AMG):  # per level: residual, restriction, prolongation; the coarse product
        assert program.kernels.count("axpby") == 3 * len(M.levels) + 1
        assert M.details()["hierarchy_dtype"] == str(M.storage_dtype)


def split_iterations(A, M, b, r_low):
    """``(state, x)`` of pcg_split.cu's kernels (their NumPy meaning) around the replayed launches of ``M``;
    ``r_low``: the update writes r in the levels' precision, which the launches read (else they convert r)."""
    from solvers.kernels import pcg_ref

    n = A.shape[0]
    x, r, z, p0, p1 = np.zeros(n), b.copy(), np.zeros(n), np.zeros(n), np.zeros(n)
    converted = np.zeros(n, M.storage_dtype) if r_low else None
    program = HostProgram(r, z, M.storage_dtype, converted)
    M.device_apply(program)
    program.close()
    state = dict(status=pcg_ref.RUNNING, iteration=-1, parity=0, tol=RTOL * np.linalg.norm(b), maxiter=500,
                 rz=0.0, beta=0.0, alpha=0.0, pq=0.0, rnorm=0.0)
    if r_low:  # the set-up pass: r = b, converted once by the solver
        converted[:] = r
    program.launch()
    pcg_ref.split_decide(r, z, state)
    while state["status"] == pcg_ref.RUNNING:
        q = pcg_ref.direction_product(A, z, p0, p1, state)
        pcg_ref.split_update(x, r, q, p0, p1, state, converted)
        program.launch()
        pcg_ref.split_decide(r, z, state)
    return state, x


def test_the_split_iteration_with_the_replayed_launches_is_classic_pcg(problems):
    """pcg_split.cu's kernels (their NumPy meaning) around the launch sequence take CPU PCG's iterations."""
    from solvers.kernels import pcg_ref

    A, B, b = problems["elasticity"]
    state, x = split_iterations(A, AMG(near_nullspace=B).setup(A), b, r_low=False)
    reference = cpu_solve(A, AMG(near_nullspace=B), b)[1]
    assert state["status"] == pcg_ref.CONVERGED and state["iteration"] == reference.iterations
    np.testing.assert_allclose(x, reference.x, rtol=1e-9, atol=1e-12)


def test_float32_levels_read_r_as_the_update_converted_it(problems):
    """The update writing r in float32 for the cycle gives the bits the cycle's own conversion gave."""
    A, B, b = problems["diffusion"]
    M = AMG(near_nullspace=B, hierarchy_dtype="float32").setup(A)
    (state, x), (state_converted, x_converted) = (split_iterations(A, M, b, r_low) for r_low in (True, False))
    assert state == state_converted and np.array_equal(x, x_converted)


def test_the_cpu_apply_of_a_float32_hierarchy_returns_the_solvers_precision(problems):
    A, B, b = problems["elasticity"]
    M = AMG(near_nullspace=B, hierarchy_dtype="float32").setup(A)
    assert M.levels[0].A.dtype == np.float32 and M.apply(b).dtype == np.float64
    full = PCG(A, preconditioner=AMG(near_nullspace=B), rtol=RTOL, device="cpu").solve(b)
    single = PCG(A, preconditioner=AMG(near_nullspace=B, hierarchy_dtype="float32"), rtol=RTOL, device="cpu").solve(b)
    assert single.converged and single.true_residual_norm <= 2 * RTOL * np.linalg.norm(b)
    assert single.iterations <= full.iterations + 2


class HalfJacobi(Preconditioner):
    """A plug-in written outside the package, GPU apply included: ``M^-1 = D^-1 / 2``, one launch."""

    name = "half-jacobi"
    variants = {"cpu": ("classic",), "gpu": ("classic",)}

    def _setup(self, A):
        self.scale = 0.5 / A.diagonal()  # NumPy, or CuPy for the device matrix of a GPU solve

    def apply(self, r):
        return self.scale * r

    def device_apply(self, program):
        program.scaled_add(program.vector(self.scale), program.input, program.output, accumulate=False)


def test_a_plug_in_gives_its_gpu_apply_in_its_own_class(problems):
    A, _, r = problems["diffusion"]
    M = HalfJacobi().setup(A)
    z, program = replayed(M, r)
    assert program.kernels == ["scaled_add"] and np.array_equal(z, M.apply(r))


# -- on the GPU -----------------------------------------------------------------------------------
MODES = ("eager", "graph", "while")


def gpu_solve(A, preconditioner, b, **options):
    options = dict(rtol=RTOL, device="gpu", reorder="none", maxiter=3000) | options
    solver = PCG(A, preconditioner=preconditioner, **options)
    return solver, solver.solve(b)


def cpu_solve(A, preconditioner, b):
    solver = PCG(A, preconditioner=preconditioner, rtol=RTOL, device="cpu", variant="classic", reorder="none")
    return solver, solver.solve(b)


def test_each_matrix_of_a_cycle_takes_the_layout_of_its_shape():
    from solvers.pcg.preconditioners.device import SMALL_ROWS, layout_for
    n = 4 * SMALL_ROWS
    assert layout_for((n, n), n) == "auto"  # the finest operator: as the PCG kernels would
    assert layout_for((n // 2, n // 2), n) == "sell"
    assert layout_for((n // 2, n), n) == "sell"  # a restriction
    assert layout_for((n, n // 2), n) == "csr"  # a prolongation: SELL's padding would read past its columns
    assert layout_for((SMALL_ROWS - 1, SMALL_ROWS - 1), n) == layout_for((SMALL_ROWS - 1, n), n) == "csr"
    assert layout_for((SMALL_ROWS, SMALL_ROWS), n) == "sell"
    assert layout_for((SMALL_ROWS, SMALL_ROWS), n, dense=True) == "csr"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_kernels_match_their_numpy_reference(dtype, monkeypatch):
    import cupy
    from solvers.pcg.preconditioners import device
    from solvers.pcg.preconditioners.device import DeviceProgram

    monkeypatch.setattr(device, "SMALL_ROWS", 0)  # small matrices in every format, SELL included

    rng = np.random.default_rng(5)
    tolerance = 1e-12 if dtype == "float64" else 1e-5
    # rows of 1 to ~80 entries (SELL of 1 to 8 lanes and long rows in pieces), a stencil (DIA, the
    # solver's size), a prolongation (more rows than columns: CSR), a restriction, a dense block and the
    # stencil numbered at random (ELL)
    matrices = [sp.random(500, 500, density=d, random_state=k, format="csr") + sp.eye(500) for k, d in
                enumerate((0.0, 0.004, 0.02, 0.16))]
    matrices += [rotated_anisotropic_diffusion((40, 40)), sp.random(500, 120, density=0.05, random_state=9,
                                                                    format="csr"),
                 sp.random(120, 500, density=0.05, random_state=8, format="csr"), rng.standard_normal((40, 500))]
    order = rng.permutation(matrices[4].shape[0])
    matrices.append(sp.csr_matrix(matrices[4].tocsr()[order][:, order]))
    formats = set()
    for M in matrices:
        rows, cols = M.shape
        v, y, out = (rng.standard_normal(k) for k in (cols, rows, rows))
        program = DeviceProgram(cupy.zeros(rows), cupy.zeros(rows), dtype)
        dv, dy, dout = (cupy.asarray(a, dtype=dtype) for a in (v, y, out))
        held = program.matrix(M)
        formats.add(held.format.name)
        program.axpby(held, dv, dy, dout, -1.0, 1.0)
        program.launch()
        expected = precond_ref.axpby(M, v.astype(dtype), y.astype(dtype), -1.0, 1.0)
        assert np.linalg.norm(dout.get() - expected) <= tolerance * np.linalg.norm(expected) * 10
    assert formats == {"dia", "ell", "sell", "csr"}
    for A in (matrices[2], matrices[4]):
        n = A.shape[0]
        b, dinv, x, d_old, rs, s = (rng.standard_normal(n) for _ in range(6))
        host = {k: a.astype(dtype) for k, a in dict(b=b, dinv=dinv, x=x, d_old=d_old, rs=rs, s=s).items()}
        dev = {k: cupy.asarray(a) for k, a in host.items()}
        d_new, d0, rs0, x_new, swept, begun, d_started, rs_started, x_started = (
            cupy.zeros(n, dtype=dtype) for _ in range(9))
        program = DeviceProgram(cupy.zeros(n), cupy.zeros(n), dtype)
        held = program.matrix(A)
        program.chebyshev_step(held, dev["dinv"], dev["d_old"], d_new, dev["rs"], dev["x"], x_new, 0.3, 0.7,
                               add_old=True)
        program.chebyshev_residual(held, dev["x"], dev["b"], dev["dinv"], 0.25, d0, rs0, swept)
        program.chebyshev_start_step(held, dev["b"], dev["dinv"], 0.25, d_started, rs_started, x_started, 0.3, 0.7)
        program.jacobi_sweep(held, swept, dev["b"], dev["s"], begun)
        program.scaled_add(dev["dinv"], dev["b"], dev["x"], accumulate=True)
        program.chebyshev_begin(dev["b"], dev["dinv"], 0.5, dev["s"], dev["d_old"], dev["rs"])
        program.launch()
        want = {"x_new": np.zeros(n, dtype), "swept": np.zeros(n, dtype)}
        want["d_new"] = precond_ref.chebyshev_step(A, host["dinv"], host["d_old"], host["rs"], host["x"],
                                                   want["x_new"], 0.3, 0.7, True)
        want["rs1"] = host["rs"].copy()
        want["d0"], want["rs0"] = precond_ref.chebyshev_residual(A, host["x"], host["b"], host["dinv"], 0.25,
                                                                 want["swept"])
        want["x_started"] = np.zeros(n, dtype)
        want["d_started"], want["rs_started"] = precond_ref.chebyshev_start_step(
            A, host["b"], host["dinv"], 0.25, want["x_started"], 0.3, 0.7)
        want["begun"] = precond_ref.jacobi_sweep(A, want["swept"], host["b"], host["s"])
        precond_ref.scaled_add(host["dinv"], host["b"], host["x"], accumulate=True)
        want["d_begin"], want["rs_begin"] = precond_ref.chebyshev_begin(host["b"], host["dinv"], 0.5, host["s"])
        got = dict(x_new=x_new, swept=swept, d_new=d_new, d0=d0, rs0=rs0, begun=begun, x=dev["x"],
                   d_started=d_started, rs_started=rs_started, x_started=x_started,
                   d_begin=dev["d_old"], rs_begin=dev["rs"], s=dev["s"])
        want.update(x=host["x"], d_begin=want["d_begin"], rs_begin=want["rs_begin"], s=host["s"])
        del want["rs1"]
        for key, value in want.items():
            assert np.linalg.norm(got[key].get() - value) <= tolerance * 10 * np.linalg.norm(value), key


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["chebyshev 3", "amg chebyshev", "amg jacobi x2", "amg float32 hierarchy"])
def test_gpu_apply_matches_the_cpu_apply(problems, name):
    import cupy
    from solvers.pcg.preconditioners.device import DeviceProgram

    A, B, r = problems["elasticity"]
    M = PRECONDITIONERS[name](B).setup(A)
    r_dev, z_dev = cupy.asarray(r), cupy.zeros(r.size)
    program = DeviceProgram(r_dev, z_dev, M.storage_dtype)
    M.device_apply(program)
    program.close().launch()
    expected = M.apply(r)
    tolerance = 1e-5 if M.storage_dtype == np.float32 else 1e-11
    assert np.linalg.norm(z_dev.get() - expected) <= tolerance * np.linalg.norm(expected)
    program.launch()  # the same launches again: the same bits
    first = z_dev.get()
    program.launch()
    assert np.array_equal(z_dev.get(), first)


@pytest.mark.gpu
def test_levels_already_on_the_device_are_used_where_they_are(problems):
    """A hierarchy set up on the GPU hands over cupyx matrices and CuPy vectors: they are laid out on the device."""
    import cupy
    import cupyx.scipy.sparse as csp
    from solvers.pcg.preconditioners.device import DeviceProgram

    A, B, r = problems["elasticity"]
    M = AMG(near_nullspace=B).setup(A)
    expected = M.apply(r)
    for level in M.levels:
        level.A, level.P, level.R = (csp.csr_matrix(m) for m in (level.A, level.P, level.R))
        level.smoother.A = level.A
        level.smoother.inverse_diagonal = cupy.asarray(level.smoother.inverse_diagonal)
    M.coarse_inverse = cupy.asarray(M.coarse_inverse)
    z = cupy.zeros(r.size)
    program = DeviceProgram(cupy.asarray(r), z, M.storage_dtype)
    M.device_apply(program)
    program.close().launch()
    assert np.linalg.norm(z.get() - expected) <= 1e-11 * np.linalg.norm(expected)
    for level in M.levels:
        for operator in (level.A, level.P, level.R):
            held = program.matrix(operator)  # laid out from the device arrays, on the device
            assert held.source is operator and held.format.xp is cupy


SAME_SMOOTHER = {  # our AMG options -> PyAMG's smoothers doing the same (as in test_preconditioners.py)
    "jacobi x2": (dict(smoother="jacobi", sweeps=2), ("jacobi", {"omega": 4.0 / 3.0, "iterations": 2})),
    "chebyshev": (dict(smoother="chebyshev"), ("chebyshev", {"degree": 3})),
}


@pytest.mark.gpu
@pytest.mark.parametrize("problem", ["diffusion", "elasticity"])
@pytest.mark.parametrize("smoother", sorted(SAME_SMOOTHER))
def test_gpu_amg_pcg_agrees_with_the_cpu_and_with_pyamg(problems, problem, smoother):
    A, B, b = problems[problem]
    ours, theirs_smoother = SAME_SMOOTHER[smoother]
    # PyAMG's hierarchy, uploaded, in the CPU's precision (the GPU's default is float32)
    gpu, res = gpu_solve(A, AMG(near_nullspace=B, setup="cpu", hierarchy_dtype="float64", **ours), b)
    cpu, ref = cpu_solve(A, AMG(near_nullspace=B, **ours), b)
    assert gpu.device == "gpu" and gpu.variant == "classic" and res.converged
    assert res.true_residual_norm <= 2 * RTOL * np.linalg.norm(b)
    assert gpu.preconditioner_details["levels"] == cpu.preconditioner_details["levels"]  # the same hierarchy
    assert abs(res.iterations - ref.iterations) <= 2, (res.iterations, ref.iterations)
    residuals = []
    details = gpu.preconditioner_details
    np.random.seed(0)  # as the plug-in seeds PyAMG: the same hierarchy
    ml = pyamg.smoothed_aggregation_solver(A, B=B, max_coarse=details["coarse_size"],
                                           strength=("symmetric", {"theta": details["theta"]}),
                                           presmoother=theirs_smoother, postsmoother=theirs_smoother)
    ml.solve(b, tol=RTOL, accel="cg", maxiter=2000, residuals=residuals)
    theirs = len(residuals) - 1
    assert abs(res.iterations - theirs) <= 0.1 * theirs, (res.iterations, theirs)
    default = []
    pyamg.smoothed_aggregation_solver(A, B=B).solve(b, tol=RTOL, accel="cg", maxiter=2000, residuals=default)
    assert res.iterations <= 1.5 * (len(default) - 1), (res.iterations, len(default) - 1)


@pytest.mark.gpu
@pytest.mark.parametrize("preconditioner", ["amg", "chebyshev"])
def test_eager_graph_and_while_give_the_same_bits(problems, preconditioner):
    A, B, b = problems["elasticity"]
    make = (lambda: AMG(near_nullspace=B, setup="cpu")) if preconditioner == "amg" else (lambda: Chebyshev(4))
    runs = {}
    for mode in MODES:
        solver, res = gpu_solve(A, make(), b, mode=mode, unroll=4, record_history=True)
        assert solver.mode == mode and res.converged
        runs[mode] = (res.iterations, res.x.get(), res.history)
    its, x, history = runs["while"]
    for mode in ("eager", "graph"):
        assert runs[mode][0] == its and np.array_equal(runs[mode][1], x) and np.array_equal(runs[mode][2], history)


@pytest.mark.gpu
@pytest.mark.parametrize("problem", ["diffusion", "elasticity"])
def test_a_hierarchy_built_on_the_gpu_is_cycled_where_it_is(problems, problem):
    A, B, b = problems[problem]
    # setup "auto": on the device for a GPU solve; float64 levels, as the CPU cycle below has them
    solver, res = gpu_solve(A, AMG(near_nullspace=B, hierarchy_dtype="float64"), b)
    M = solver._impl.M
    assert M.built_by == "GPU set-up" and res.converged
    assert res.true_residual_norm <= 2 * RTOL * np.linalg.norm(b)
    for level in M.levels[1:]:  # the levels the set-up left on the device are not copied
        held = solver._impl.program.matrix(level.A)
        assert held.source is level.A and held.format.xp.__name__ == "cupy"
    cpu = PCG(A, preconditioner=AMG(near_nullspace=B, setup="gpu"), rtol=RTOL, device="cpu", variant="classic",
              reorder="none").solve(b)  # the same hierarchy, copied back for the CPU cycle
    assert abs(res.iterations - cpu.iterations) <= 2, (res.iterations, cpu.iterations)
    again = solver.solve(b)
    assert again.iterations == res.iterations and np.array_equal(again.x.get(), res.x.get())


@pytest.mark.gpu
def test_gpu_chebyshev_matches_the_cpu(problems):
    A, _, b = problems["diffusion"]
    gpu, res = gpu_solve(A, Chebyshev(4), b)
    cpu, ref = cpu_solve(A, Chebyshev(4), b)
    assert res.converged and abs(res.iterations - ref.iterations) <= 2, (res.iterations, ref.iterations)
    # the bound comes from Lanczos on the device, from the same start vector
    assert gpu.preconditioner_details["lambda_max_estimate"] == pytest.approx(
        cpu.preconditioner_details["lambda_max_estimate"], rel=1e-9)
    jacobi = gpu_solve(A, "jacobi", b)[1]
    assert res.iterations <= 0.45 * jacobi.iterations


@pytest.mark.gpu
def test_a_plug_in_runs_on_the_gpu(problems):
    A, _, b = problems["diffusion"]
    solver, res = gpu_solve(A, HalfJacobi(), b)
    jacobi = gpu_solve(A, "jacobi", b, variant="classic")[1]
    assert solver.device == "gpu" and res.converged and abs(res.iterations - jacobi.iterations) <= 2


@pytest.mark.gpu
@pytest.mark.parametrize("problem", ["diffusion", "elasticity"])
def test_float32_hierarchy_inside_float64_cg_by_default(problems, problem):
    A, B, b = problems[problem]
    full = gpu_solve(A, AMG(near_nullspace=B, hierarchy_dtype="float64"), b)[1]
    solver, single = gpu_solve(A, AMG(near_nullspace=B), b)
    assert solver.preconditioner_details["hierarchy_dtype"] == "float32" and single.x.dtype == np.float64
    assert single.converged and single.true_residual_norm <= 2 * RTOL * np.linalg.norm(b)
    assert single.iterations <= full.iterations + 2, (single.iterations, full.iterations)
    float32_solve = gpu_solve(A, AMG(near_nullspace=B), b, dtype="float32", rtol=1e-5)[0]
    assert float32_solve.preconditioner_details["hierarchy_dtype"] == "float32"


@pytest.mark.gpu
def test_new_values_many_right_hand_sides_and_a_start_vector(problems):
    A = rotated_anisotropic_diffusion((64, 64))
    A2 = rotated_anisotropic_diffusion((64, 64), epsilon=1e-2, theta=np.pi / 3)
    b = np.random.default_rng(1).random(A.shape[0])
    solver, first = gpu_solve(A, AMG(coarse_size=20), b)
    again = solver.solve(b)
    assert solver.instantiations == 1 and again.iterations == first.iterations
    assert np.array_equal(again.x.get(), first.x.get())
    warm = solver.solve(b, x0=first.x)
    assert warm.converged and warm.iterations <= 3
    solver.update_values(A2)
    assert solver.preconditioner_details["aggregation"] == "reused (values updated)"
    res = solver.solve(b)
    fresh = gpu_solve(A2, AMG(coarse_size=20), b)[1]
    assert res.converged and abs(res.iterations - fresh.iterations) <= 0.2 * fresh.iterations + 1


@pytest.mark.gpu
def test_enqueue_refuses_a_preconditioner_of_several_kernels():
    import cupy
    from solvers.errors import InputError

    A = rotated_anisotropic_diffusion((32, 32))
    solver = PCG(A, preconditioner="chebyshev", device="gpu", reorder="none")
    b = cupy.ones(A.shape[0])
    with pytest.raises(InputError, match="preconditioner 'chebyshev' runs in a graph of kernels: use solve"):
        solver.enqueue(b, cupy.zeros_like(b))


@pytest.mark.gpu
def test_cli_runs_amg_on_the_gpu_with_the_same_report(tmp_path, capsys):
    import json

    from solvers.pcg.__main__ import main

    js = {device: tmp_path / f"{device}.json" for device in ("cpu", "gpu")}
    for device in js:
        code = main(["--matrix", EXAMPLE, "--precond", "amg", "--amg-setup", "cpu", "--device", device,
                     "--json", str(js[device])])
        assert code == 0
    capsys.readouterr()
    cpu, gpu = (json.loads(js[d].read_text()) for d in ("cpu", "gpu"))
    assert set(cpu) == set(gpu) and set(cpu["preconditioner_details"]) == set(gpu["preconditioner_details"])
    assert gpu["converged"] and abs(gpu["iterations"] - cpu["iterations"]) <= 2


@pytest.mark.gpu
@pytest.mark.parametrize("precond", ["amg", "chebyshev"])
def test_products_with_the_solvers_matrix_take_its_layout(problems, precond):
    """The finest operator is laid out once (the solver's layout, values in the hierarchy's precision);
    the coarsest inverse, dense, is laid out as CSR; a float32 hierarchy reads r as the update converted it."""
    A, B, b = problems["diffusion"]
    M = AMG(near_nullspace=B) if precond == "amg" else Chebyshev(3)
    solver = PCG(A, preconditioner=M, rtol=RTOL, device="gpu")
    impl = solver._impl
    finest = impl.M.levels[0].A if precond == "amg" else impl.M.smoother.A
    held = impl.program.matrix(finest)  # laid out at set-up: the same object back
    assert held.format is impl.format and held.values.dtype == impl.M.storage_dtype
    if precond == "amg":  # float32 levels inside float64 CG: the update writes their input, no conversion
        assert impl.program.matrix(impl.M.coarse_inverse).format.name == "csr"
        assert impl.program.input is impl.r_low and impl.r_low.dtype == np.float32
    res = solver.solve(b)
    assert res.converged and res.true_residual_norm <= 1e-7 * np.linalg.norm(b)


RANDOM_PRECONDITIONERS = {"chebyshev": lambda: Chebyshev(4), "amg, GPU set-up": lambda: AMG(),
                          "amg, CPU set-up, float64": lambda: AMG(setup="cpu", hierarchy_dtype="float64")}


@pytest.mark.gpu
@given(A=spd_matrices(max_n=700), name=st.sampled_from(sorted(RANDOM_PRECONDITIONERS)),
       mode=st.sampled_from(MODES))
@fuzz(30)
def test_random_systems_converge_with_the_gpu_preconditioners(A, name, mode):
    """Random row-length profiles (hub rows, diagonal-only rows, scattered numberings): each GPU
    preconditioner converges to a true residual within the tolerance, and a second solve gives the same bits."""
    b = np.random.default_rng(A.shape[0]).standard_normal(A.shape[0])
    solver, res = gpu_solve(A, RANDOM_PRECONDITIONERS[name](), b, mode=mode, maxiter=10 * A.shape[0] + 100)
    assert solver.device == "gpu" and res.converged, (solver.path, res.reason.label)
    assert np.linalg.norm(b - A @ res.x.get()) <= 2 * RTOL * np.linalg.norm(b)
    again = solver.solve(b)
    assert again.iterations == res.iterations and np.array_equal(again.x.get(), res.x.get())
