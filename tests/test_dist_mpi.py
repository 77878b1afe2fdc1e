"""Distributed PCG against the single-process solver, run on every rank of an MPI job.

Run as ``mpiexec -n 2 python -m pytest -q tests/test_dist_mpi.py`` (and ``-n 3``);
``tests/test_dist.py`` does so. Started without a launcher the module is skipped.
Assertions compare values that are identical on all ranks (reduced over the job
first), so every rank passes or fails the same test and none is left waiting.
"""
import pathlib

import numpy as np
import pytest
import scipy.sparse as sp

from solvers.dist import launch

if launch.world_size() < 2:
    pytest.skip("needs an MPI launch with 2 or more ranks (mpiexec -n 2 python -m pytest ...)",
                allow_module_level=True)

from mpi4py import MPI  # noqa: E402

from solvers.dist import DistributedPCG  # noqa: E402
from solvers.dist.comm import RankError, agree  # noqa: E402
from solvers.dist.partition import nnz_bounds, split_rows  # noqa: E402
from solvers.dist.problem import poisson_distributed, read_distributed  # noqa: E402
from solvers.errors import InputError  # noqa: E402
from solvers.gallery import poisson  # noqa: E402
from solvers.pcg import PCG, Reason  # noqa: E402
from solvers.pcg.problem import load_problem  # noqa: E402

COMM = MPI.COMM_WORLD
REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "data" / "lap2D_5pt_n100.mtx"
VARIANTS = ("classic", "single-reduction")


def global_max(value):
    return COMM.allreduce(float(value), op=MPI.MAX)


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
    from solvers.dist.comm import HostComm
    host = HostComm(COMM, m.plan)
    halo = np.full(m.plan.halo_size, -1.0)
    host.start_halo(np.arange(lo, hi, dtype=float), halo)
    host.finish_halo()
    assert global_max(np.abs(halo - m.halo_columns).max() if halo.size else 0) == 0
    assert COMM.allreduce(m.plan.halo_size) > 0


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("matrix", ["lap2D", "poisson3d"])
def test_same_iterations_and_solution_as_one_process(variant, matrix):
    if matrix == "lap2D":
        p = read_distributed(COMM, str(EXAMPLE))
        single = load_problem(str(EXAMPLE))
        A, b = single.A, single.b
    else:
        p = poisson_distributed(COMM, (14, 13, 12))
        A = poisson((14, 13, 12)).tocsr()
        b = A @ np.ones(A.shape[0])
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
    with pytest.raises(RankError, match="ZeroDivisionError"):
        agree(COMM, lambda: 1 / (COMM.rank - 1))
    assert agree(COMM, lambda: COMM.rank) == COMM.rank


def test_non_positive_diagonal_on_one_rank():
    A = poisson((12, 12)).tolil()
    A[A.shape[0] - 1, A.shape[0] - 1] = 0.0
    rows, bounds = split_evenly(A.tocsr())
    with pytest.raises(InputError, match=f"row {A.shape[0]}"):
        DistributedPCG(rows, bounds, COMM, device="cpu")


def test_bad_options_and_vectors():
    rows, bounds = split_evenly(poisson((8, 8)))
    with pytest.raises(InputError, match="variant"):
        DistributedPCG(rows, bounds, COMM, device="cpu", variant="pipelined")
    solver = DistributedPCG(rows, bounds, COMM, device="cpu")
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
