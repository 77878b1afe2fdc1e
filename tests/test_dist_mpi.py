"""Distributed PCG against the single-process solver, run on every rank of an MPI job.

Run as ``mpiexec -n 2 python -m pytest -q tests/test_dist_mpi.py`` (and ``-n 3``);
``tests/test_dist.py`` does so. Started without a launcher the module is skipped.
Assertions compare values that are identical on all ranks (reduced over the job
first), so every rank passes or fails the same test and none is left waiting.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from solvers.distributed import launch

if launch.world_size() < 2:
    pytest.skip("needs an MPI launch with 2 or more ranks (mpiexec -n 2 python -m pytest ...)",
                allow_module_level=True)

from mpi4py import MPI  # noqa: E402

from solvers.distributed import DistributedPCG  # noqa: E402
from solvers.distributed.comm import RankError, agree  # noqa: E402
from solvers.distributed.partition import nnz_bounds, split_rows  # noqa: E402
from solvers.distributed.problem import poisson_distributed  # noqa: E402
from solvers.errors import DeviceError, InputError  # noqa: E402
from solvers.gallery import poisson  # noqa: E402
from solvers.pcg import PCG, Chebyshev, Reason  # noqa: E402

from mpi_cases import COMM, VARIANTS, global_max, problem_pair  # noqa: E402
from solvers.distributed.gpu import KERNELS  # noqa: E402


def rows_of(A, bounds):
    r = COMM.rank
    return sp.csr_matrix(A)[bounds[r]:bounds[r + 1]]


def split_evenly(A):
    bounds = nnz_bounds(np.diff(sp.csr_matrix(A).indptr), 0, A.shape[0], COMM.size)
    return rows_of(A, bounds), bounds


def test_partition_reassembles_and_the_plan_delivers_the_halo():
    A = poisson((9, 7, 5)).tocsr()
    rows, bounds = split_evenly(A)
    m = split_rows(rows, bounds, COMM)
    lo, hi = m.lo, m.hi
    dense = np.zeros((hi - lo, A.shape[0]))
    dense[:, lo:hi] = m.local.toarray()
    dense[np.ix_(m.boundary_rows, m.halo_columns)] += m.halo.toarray()
    assert global_max(np.abs(dense - A[lo:hi].toarray()).max()) == 0
    # One exchange of x = global index fills the halo with the columns' own numbers.
    from solvers.distributed.comm import HostComm
    host = HostComm(COMM, m.plan)
    halo = np.full(m.plan.halo_size, -1.0)
    host.start_halo(np.arange(lo, hi, dtype=float), halo)
    host.finish_halo()
    assert global_max(np.abs(halo - m.halo_columns).max() if halo.size else 0) == 0
    assert COMM.allreduce(m.plan.halo_size) > 0
    # The extended block: whole rows against x with its halo at the tail, in global column order.
    x = np.concatenate([np.arange(lo, hi, dtype=float), halo])
    assert m.extended.shape == (hi - lo, hi - lo + m.plan.halo_size)
    assert global_max(np.abs(m.extended @ x - A[lo:hi] @ np.arange(A.shape[0], dtype=float)).max()) == 0
    assert all(np.all(np.diff(x[m.extended.indices[a:b]]) > 0) for a, b in zip(m.extended.indptr, m.extended.indptr[1:]))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("matrix", ["lap2D", "poisson3d"])
def test_same_iterations_and_solution_as_one_process(variant, matrix):
    p, A, b = problem_pair(matrix, (14, 13, 12))
    ref = PCG(A, rtol=1e-9, device="cpu", record_history=True).solve(b)
    solver = DistributedPCG(p.rows, p.bounds, COMM, rtol=1e-9, device="cpu", variant=variant,
                            record_history=True)
    res = solver.solve(p.b)
    assert res.converged and res.ranks == COMM.size and res.variant == variant
    assert res.iterations == ref.iterations
    lo, hi = p.bounds[COMM.rank], p.bounds[COMM.rank + 1]
    assert global_max(np.abs(res.x - ref.x[lo:hi]).max()) <= 1e-10 * np.abs(ref.x).max()
    np.testing.assert_allclose(res.history, ref.history, rtol=1e-6)
    assert res.true_residual_norm == pytest.approx(ref.true_residual_norm, rel=1e-3, abs=1e-12)
    assert p.solution_error(res.x) < 1e-7
    assert res.communication_time > 0 and res.compute_time > 0
    gathered = solver.gather(res.x)
    if COMM.rank == 0:
        np.testing.assert_allclose(gathered, ref.x, rtol=1e-9)
    else:
        assert gathered is None


@pytest.mark.parametrize("variant", VARIANTS)
def test_initial_guess_nonzero_on_some_ranks_only(variant):
    A = poisson((30, 30)).tocsr()
    b = np.ones(A.shape[0])
    x0 = np.zeros(A.shape[0])
    x0[:50] = 1.0  # only rank 0's rows
    ref = PCG(A, rtol=1e-10, device="cpu").solve(b, x0)
    rows, bounds = split_evenly(A)
    lo, hi = bounds[COMM.rank], bounds[COMM.rank + 1]
    res = DistributedPCG(rows, bounds, COMM, rtol=1e-10, device="cpu", variant=variant).solve(b[lo:hi], x0[lo:hi])
    assert res.iterations == ref.iterations
    assert global_max(np.abs(res.x - ref.x[lo:hi]).max()) < 1e-8


@pytest.mark.parametrize("variant", VARIANTS)
def test_stop_reasons_match_one_process(variant):
    A = poisson((16, 16)).tocsr()
    b = np.ones(A.shape[0])
    rows, bounds = split_evenly(A)
    lo, hi = bounds[COMM.rank], bounds[COMM.rank + 1]
    solver = DistributedPCG(rows, bounds, COMM, device="cpu", variant=variant)
    res = solver.solve(b[lo:hi], maxiter=7)
    assert res.reason is Reason.MAX_ITERATIONS and res.iterations == 7
    assert solver.solve(np.zeros(hi - lo)).iterations == 0
    bad = b[lo:hi].copy()
    if COMM.rank == COMM.size - 1:
        bad[-1] = np.inf
    assert solver.solve(bad).reason is Reason.NOT_FINITE
    # Indefinite: a negative block on the last rank only; the decision is still taken together.
    C = (A - sp.diags(np.where(np.arange(A.shape[0]) >= bounds[-2], 8.0, 0.0))).tocsr()
    single = PCG(C, device="cpu", preconditioner="none").solve(b)
    res = DistributedPCG(rows_of(C, bounds), bounds, COMM, device="cpu", variant=variant,
                         preconditioner="none").solve(b[lo:hi])
    assert single.reason is Reason.BREAKDOWN
    assert (res.reason, res.iterations) == (single.reason, single.iterations)


def test_setup_error_on_one_rank_is_raised_on_all():
    def fails_on_last():
        if COMM.rank == COMM.size - 1:
            raise InputError("bad piece")
        return COMM.rank
    with pytest.raises(InputError, match=f"rank {COMM.size - 1}: bad piece"):
        agree(COMM, fails_on_last)
    def refused_everywhere():
        raise InputError("not here", "--option")
    with pytest.raises(InputError) as refused:
        agree(COMM, refused_everywhere)
    assert (refused.value.source, refused.value.problem) == ("--option", "not here")  # the source kept apart
    with pytest.raises(RankError, match="ZeroDivisionError"):
        agree(COMM, lambda: 1 / (COMM.rank - 1))
    assert agree(COMM, lambda: COMM.rank) == COMM.rank


def test_non_positive_diagonal_on_one_rank():
    A = poisson((12, 12)).tolil()
    A[A.shape[0] - 1, A.shape[0] - 1] = 0.0
    rows, bounds = split_evenly(A.tocsr())
    with pytest.raises(InputError, match=f"row {A.shape[0]}"):
        DistributedPCG(rows, bounds, COMM, device="cpu")


@pytest.mark.parametrize("preconditioner", ["chebyshev", "amg", Chebyshev(5)])
def test_single_process_preconditioners_are_refused(preconditioner):
    rows, bounds = split_evenly(poisson((8, 8)))
    with pytest.raises(InputError, match="runs in a single process only; distributed runs take none or jacobi") as err:
        DistributedPCG(rows, bounds, COMM, device="cpu", preconditioner=preconditioner)
    assert err.value.source in ("preconditioner 'chebyshev'", "preconditioner 'amg'")


def test_bad_options_and_vectors():
    rows, bounds = split_evenly(poisson((8, 8)))
    with pytest.raises(InputError, match="variant"):
        DistributedPCG(rows, bounds, COMM, device="cpu", variant="pipelined")
    solver = DistributedPCG(rows, bounds, COMM, device="cpu")
    assert solver.variant == "single-reduction"  # auto on a small system: fewer allreduces win
    with pytest.raises(InputError, match="expected"):
        solver.solve(np.ones(3 if COMM.rank == 0 else bounds[COMM.rank + 1] - bounds[COMM.rank]))


def test_poisson_generated_per_rank_matches_the_global_matrix():
    shape = (6, 5, 7)
    p = poisson_distributed(COMM, shape)
    A = poisson(shape).tocsr()
    assert p.n == A.shape[0] and p.nnz == A.nnz
    lo, hi = p.bounds[COMM.rank], p.bounds[COMM.rank + 1]
    assert global_max(abs(p.rows - A[lo:hi]).max()) == 0
    assert global_max(np.abs(p.b - A[lo:hi] @ np.ones(A.shape[0])).max()) == 0


# -- the GPU driver's host logic on the CPU ---------------------------------------------------------
# DistGPUPCG with its device layer replaced: arrays are NumPy arrays, kernels are their NumPy
# meaning (kernels/pcg_ref.py, kernels/dist_ref.py), a captured graph replays the kernel calls made
# during capture, and "NCCL" is MPI. This runs the driver's step lists, buffer offsets, halo tails
# and pending-decision protocol on every CI run; the GPU tests check the compiled kernels.
class _Array(np.ndarray):
    def get(self, stream=None):
        return np.array(self)

    def set(self, values, stream=None):
        self[...] = values


class _Stream:
    def __init__(self):
        self.captured = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def begin_capture(self):
        self.captured = []

    def end_capture(self):
        calls, self.captured = self.captured, None
        return _Graph(calls)

    def wait_event(self, event):
        pass


class _Graph:
    def __init__(self, calls):
        self.calls = calls

    def launch(self, stream):
        assert stream.captured is None
        for call in self.calls:
            call()


class _Event:
    def __init__(self, disable_timing=False):
        self.t = None

    def record(self, stream=None):
        import time
        self.t = time.perf_counter()


def _fake_cupy():
    import types
    wrap = lambda a: a.view(_Array)  # noqa: E731
    cuda = types.SimpleNamespace(
        Stream=_Stream, Event=_Event, Device=lambda: types.SimpleNamespace(synchronize=lambda: None), get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3,
        memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))
    return types.SimpleNamespace(
        cuda=cuda, float64=np.float64, int32=np.int32, uint8=np.uint8, dot=np.dot,
        zeros=lambda n, dtype=np.float64: wrap(np.zeros(n, dtype=dtype)),
        asarray=lambda a, dtype=None: wrap(np.array(a, dtype=dtype)))


class _HostNccl:
    def allreduce(self, send, recv, count, stream):
        COMM.Allreduce(np.array(send[:count]), recv[:count], op=MPI.SUM)

    def transfers(self, plan, sendbuf, halo):
        return plan, sendbuf, halo

    def exchange(self, transfers, stream):
        from solvers.distributed.comm import HostComm
        plan, sendbuf, halo = transfers
        host = HostComm(COMM, plan)
        host._requests = [COMM.Irecv(halo[plan.recv_offsets[i]:plan.recv_offsets[i + 1]], source=r, tag=9)
                          for i, r in enumerate(plan.recv_ranks)]
        host._requests += [COMM.Isend(np.array(sendbuf[plan.send_offsets[i]:plan.send_offsets[i + 1]]), dest=r,
                                      tag=9) for i, r in enumerate(plan.send_ranks)]
        host.finish_halo()


def _host_kernels():
    import solvers.kernels.dist_ref as ref
    from solvers.kernels import pcg_ref

    def residual(A, x, b, out):
        out[:A.shape[0]] = pcg_ref.matrix_residual(A, x[:A.shape[1]], b[:A.shape[0]])

    table = {name: getattr(ref, name) for name in KERNELS if name != "matrix_residual"}
    table["matrix_residual"] = residual

    def launcher(fn):
        def launch(grid, block, args, stream=None):
            call = lambda: fn(*args)  # noqa: E731
            if stream is not None and stream.captured is not None:
                stream.captured.append(call)
            else:
                call()
        return launch

    return {name: launcher(fn) for name, fn in table.items()}


def _host_driver():
    import types

    from solvers.distributed.gpu import DistGPUPCG
    from solvers.formats import choose_format

    class HostDriver(DistGPUPCG):
        """The driver over NumPy arrays, with the kernels' NumPy meaning (kernels/dist_ref.py)."""

        device_formats = []

        def _backend(self):
            return _fake_cupy()

        def _bind(self, comm):
            return "host emulation"

        def _communicator(self, comm):
            return _HostNccl()

        def _format(self, indptr, indices):
            return choose_format(indptr, indices, np)

        def _kernels(self, matrix_format):
            HostDriver.device_formats.append(matrix_format.name)
            table = _host_kernels()
            assert set(KERNELS) == set(table)
            return table

        def _pack_args(self):
            self._matrix_args = sp.csr_matrix(self.matrix.extended, dtype=self.dtype)
            self.args = types.SimpleNamespace(A=self._matrix_args, **self._fields())

        def _resident_blocks(self, kernel, spare_sms=0):
            return 2

        def _streams(self):
            return _Stream(), _Stream()

    return HostDriver


@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
@pytest.mark.parametrize("matrix", ["poisson3d", "lap2D"])
def test_gpu_driver_logic_on_host(monkeypatch, variant, matrix):
    import solvers.distributed.gpu as gpu
    driver = _host_driver()
    monkeypatch.setattr(gpu, "DistGPUPCG", driver)
    monkeypatch.setattr(DistributedPCG, "_choose_device", lambda self, device: ("gpu", None))
    p, A, b = problem_pair(matrix, (9, 8, 7))
    ref = PCG(A, rtol=1e-9, device="cpu", record_history=True).solve(b)
    solver = DistributedPCG(p.rows, p.bounds, COMM, rtol=1e-9, device="gpu", variant=variant,
                            record_history=True, check_every=5)
    res = solver.solve(p.b)
    assert res.device == "gpu" and res.converged and res.iterations == ref.iterations
    lo, hi = p.bounds[COMM.rank], p.bounds[COMM.rank + 1]
    assert global_max(np.abs(res.x.get() - ref.x[lo:hi]).max()) <= 1e-10 * np.abs(ref.x).max()
    np.testing.assert_allclose(res.history, ref.history, rtol=1e-6)
    assert res.true_residual_norm == pytest.approx(ref.true_residual_norm, rel=1e-2, abs=1e-12)
    # Stop reasons, an initial guess and a second solve on the same captured graphs.
    # At maxiter the iterate holds every step (classic's products take them two at a time and
    # leave one or two to the end of the solve).
    for maxiter in (6, 7):
        short = solver.solve(p.b, maxiter=maxiter)
        ref_short = PCG(A, rtol=1e-9, maxiter=maxiter, device="cpu").solve(b)
        assert short.iterations == ref_short.iterations == maxiter
        assert global_max(np.abs(short.x.get() - ref_short.x[lo:hi]).max()) <= 1e-12 * np.abs(ref_short.x).max()
    bad = p.b.copy()
    if COMM.rank == COMM.size - 1:
        bad[-1] = np.nan
    assert solver.solve(bad).reason is Reason.NOT_FINITE
    x0 = np.zeros(A.shape[0])
    x0[:20] = 1.0
    with_guess = solver.solve(p.b, x0[lo:hi])
    ref0 = PCG(A, rtol=1e-9, device="cpu").solve(b, x0)
    assert with_guess.iterations == ref0.iterations
    assert global_max(np.abs(with_guess.x.get() - ref0.x[lo:hi]).max()) < 1e-8
    # a stencil's local rows keep one thread a row: DIA, its halo columns among its diagonals (the first rank's,
    # numbered after its own rows) or exceptions (the 2-D grid of 10,000 rows: about 1% of a middle rank's entries),
    # else ELL (the 3-D grid of 504 rows: 6-12% of its later ranks' entries are halo columns, over DIA's 3.1%)
    assert driver.device_formats[-1] == ("dia" if COMM.rank == 0 or matrix == "lap2D" else "ell")


def test_out_of_device_memory_on_one_rank_stops_all(monkeypatch):
    import solvers.distributed.gpu as gpu
    driver = _host_driver()

    class Exhausted(driver):
        def _allocate_buffers(self, inverse_diagonal):
            if COMM.rank == COMM.size - 1:
                raise MemoryError("cudaMalloc failed")  # the fake device's OutOfMemoryError
            super()._allocate_buffers(inverse_diagonal)

    monkeypatch.setattr(gpu, "DistGPUPCG", Exhausted)
    monkeypatch.setattr(DistributedPCG, "_choose_device", lambda self, device: ("gpu", None))
    rows, bounds = split_evenly(poisson((10, 10)))
    with pytest.raises(DeviceError, match=f"rank {COMM.size - 1}: out of GPU memory"):
        DistributedPCG(rows, bounds, COMM, device="gpu")


@pytest.mark.parametrize("scale", [1e-300, 1e300])
def test_badly_scaled_system_is_scaled_like_one_process(scale):
    A = poisson((14, 12)).tocsr()
    b = A @ np.ones(A.shape[0])
    rows, bounds = split_evenly(A * scale)
    lo, hi = bounds[COMM.rank], bounds[COMM.rank + 1]
    res = DistributedPCG(rows, bounds, COMM, rtol=1e-9, device="cpu").solve(b[lo:hi] * scale)
    ref = PCG(A, rtol=1e-9, device="cpu").solve(b)
    assert res.converged and res.iterations == ref.iterations > 0
    assert global_max(np.abs(res.x - 1).max()) < 1e-7
    assert res.b_norm == pytest.approx(ref.b_norm * scale, rel=1e-12)


def test_float32_convergence_is_confirmed_by_the_true_residual():
    p, A, b = problem_pair("lap2D", None)
    res = DistributedPCG(p.rows, p.bounds, COMM, rtol=1e-8, device="cpu", dtype="float32").solve(p.b)
    assert res.reason is Reason.INACCURATE and res.true_residual_norm > 2 * res.tolerance
    assert DistributedPCG(p.rows, p.bounds, COMM, rtol=1e-5, device="cpu", dtype="float32").solve(p.b).converged
