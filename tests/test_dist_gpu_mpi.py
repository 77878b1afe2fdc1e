"""Distributed PCG on GPUs (one per rank) against the single-process solvers.

Run on a machine with 2 GPUs as
``mpirun -n 2 -x NCCL_NVLS_ENABLE=0 python -m pytest -q tests/test_dist_gpu_mpi.py``
(``tests/test_dist_gpu.py`` does so). Skipped without an MPI launch; the ``gpu``
marker skips it without a GPU unless ``REQUIRE_GPU=1``.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from solvers.distributed import launch

if launch.world_size() < 2:
    pytest.skip("needs an MPI launch with 2 or more ranks, one GPU each", allow_module_level=True)

from solvers.distributed import DistributedPCG  # noqa: E402
from solvers.distributed.partition import nnz_bounds  # noqa: E402
from solvers.distributed.problem import poisson_distributed  # noqa: E402
from solvers.gallery import poisson  # noqa: E402
from solvers.pcg import PCG, Reason  # noqa: E402

from mpi_cases import COMM, VARIANTS, global_max, problem_pair  # noqa: E402

pytestmark = pytest.mark.gpu


def split(A):
    A = sp.csr_matrix(A)
    bounds = nnz_bounds(np.diff(A.indptr), 0, A.shape[0], COMM.size)
    r = COMM.rank
    return A[bounds[r]:bounds[r + 1]], bounds, slice(bounds[r], bounds[r + 1])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("matrix", ["lap2D", "poisson3d"])
def test_same_iterations_and_solution_as_one_process(variant, matrix):
    p, A, b = problem_pair(matrix, (40, 36, 32))
    ref = PCG(A, rtol=1e-9, device="cpu", record_history=True).solve(b)
    one_gpu = PCG(A, rtol=1e-9, device="gpu").solve(b)
    solver = DistributedPCG(p.rows, p.bounds, COMM, rtol=1e-9, device="gpu", variant=variant,
                            record_history=True, check_every=8)
    res = solver.solve(p.b)
    assert res.device == "gpu" and res.converged and res.ranks == COMM.size
    assert res.iterations == ref.iterations == one_gpu.iterations
    lo, hi = p.bounds[COMM.rank], p.bounds[COMM.rank + 1]
    assert global_max(np.abs(res.x.get() - ref.x[lo:hi]).max()) <= 1e-9 * np.abs(ref.x).max()
    np.testing.assert_allclose(res.history, ref.history, rtol=1e-6)
    assert res.true_residual_norm == pytest.approx(ref.true_residual_norm, rel=1e-2, abs=1e-12)
    assert res.communication_time > 0 and res.compute_time > 0
    again = solver.solve(p.b)  # graphs captured once, reused
    assert again.iterations == res.iterations
    assert global_max(np.abs((again.x - res.x).get()).max()) == 0
    gathered = solver.gather(res.x)
    if COMM.rank == 0:
        np.testing.assert_allclose(gathered, ref.x, rtol=1e-8)


@pytest.mark.parametrize("variant", VARIANTS)
def test_halo_copies_match_their_owners_bit_for_bit(variant):
    # Only z (classic, packed before the update that computes it) or w (single-reduction) crosses the
    # network; each rank advances its copies of the halo's p, or r and s, itself, with the owners'
    # operations.
    from solvers.distributed.comm import HostComm
    p = poisson_distributed(COMM, (30, 28, 26))
    solver = DistributedPCG(p.rows, p.bounds, COMM, rtol=0.0, device="gpu", variant=variant, check_every=4)
    assert solver.solve(p.b, maxiter=25).iterations == 25
    impl = solver._impl
    host = HostComm(COMM, impl.matrix.plan)
    assert COMM.allreduce(impl.h) > 0
    for name in ("z", "p0", "p1") if variant == "classic" else ("r0", "r1", "s0", "s1"):
        v = getattr(impl, name).get()
        owners = np.empty(impl.h)
        host.start_halo(v[:impl.n], owners)
        host.finish_halo()
        assert COMM.allreduce(not np.array_equal(v[impl.n:], owners)) == 0, name


@pytest.mark.parametrize("variant", VARIANTS)
def test_initial_guess_and_float32(variant):
    A = poisson((60, 50)).tocsr()
    b = np.linspace(1.0, 2.0, A.shape[0])
    x0 = np.zeros(A.shape[0])
    x0[:100] = 0.5  # rank 0's rows only
    ref = PCG(A, rtol=1e-10, device="cpu").solve(b, x0)
    rows, bounds, mine = split(A)
    res = DistributedPCG(rows, bounds, COMM, rtol=1e-10, device="gpu", variant=variant).solve(b[mine], x0[mine])
    assert res.iterations == ref.iterations
    assert global_max(np.abs(res.x.get() - ref.x[mine]).max()) < 1e-8
    # float32 reaches 1e-3 here; asked for 1e-5 it stops with a true residual of 1.7e-4 (measured on
    # two H200s), which is reported as not converged.
    res32 = DistributedPCG(rows, bounds, COMM, rtol=1e-3, device="gpu", variant=variant,
                           dtype="float32").solve(b[mine])
    assert res32.converged and res32.x.dtype == np.float32
    assert res32.relative_residual < 2e-3
    deep = DistributedPCG(rows, bounds, COMM, rtol=1e-5, device="gpu", variant=variant,
                          dtype="float32").solve(b[mine])
    assert deep.reason is Reason.INACCURATE


@pytest.mark.parametrize("variant", VARIANTS)
def test_stop_reasons_match_one_process(variant):
    A = poisson((24, 24)).tocsr()
    b = np.ones(A.shape[0])
    rows, bounds, mine = split(A)
    solver = DistributedPCG(rows, bounds, COMM, device="gpu", variant=variant, check_every=4)
    res = solver.solve(b[mine], maxiter=7)
    assert res.reason is Reason.MAX_ITERATIONS and res.iterations == 7
    assert solver.solve(np.zeros(mine.stop - mine.start)).iterations == 0
    bad = b[mine].copy()
    if COMM.rank == COMM.size - 1:
        bad[-1] = np.inf
    assert solver.solve(bad).reason is Reason.NOT_FINITE
    C = (A - sp.diags(np.where(np.arange(A.shape[0]) >= bounds[-2], 8.0, 0.0))).tocsr()
    single = PCG(C, device="cpu", preconditioner="none").solve(b)
    crow, _, _ = split(C)
    res = DistributedPCG(crow, bounds, COMM, device="gpu", variant=variant, preconditioner="none").solve(b[mine])
    assert single.reason is Reason.BREAKDOWN
    assert (res.reason, res.iterations) == (single.reason, single.iterations)


def test_both_variants_agree_with_the_cpu_path():
    p = poisson_distributed(COMM, (30, 30, 30))
    out = {}
    for device in ("cpu", "gpu"):
        for variant in VARIANTS:
            r = DistributedPCG(p.rows, p.bounds, COMM, rtol=1e-10, device=device, variant=variant).solve(p.b)
            out[device, variant] = (r.iterations, r.x.get() if device == "gpu" else r.x)
    its = {k: v[0] for k, v in out.items()}
    assert its["gpu", "classic"] == its["cpu", "classic"], its
    assert max(its.values()) - min(its.values()) <= 1, its
    base = out["cpu", "classic"][1]
    assert global_max(max(np.abs(v[1] - base).max() for v in out.values())) < 1e-8
