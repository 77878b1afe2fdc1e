"""Distributed PCG on two GPUs, launched with ``mpirun``/``mpiexec -n 2``.

Needs a machine with 2 GPUs (``nvidia-h200-x2``); the ``gpu`` and ``multigpu``
markers skip these tests elsewhere (see ``tests/conftest.py``). The refusal of
two ranks on one GPU, and one rank's driver on its own, run on any GPU machine.
"""
import os

import numpy as np
import pytest
import scipy.sparse as sp

from solvers.gallery import poisson
from test_dist import EXAMPLE, run_mpi

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]


@pytest.mark.multigpu
def test_two_gpu_suite():
    proc = run_mpi(2, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", "tests/test_dist_gpu_mpi.py",
                   timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "passed" in proc.stdout


@pytest.mark.multigpu
@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
def test_cli_on_two_gpus(tmp_path, variant):
    out = tmp_path / "x.npy"
    proc = run_mpi(2, "-m", "solvers.pcg", "--matrix", EXAMPLE, "--device", "gpu", "--variant", variant,
                   "--output", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("matrix ") == 1 and "ranks                   2" in proc.stdout
    assert "device                  gpu" in proc.stdout and "converged in 183 iterations" in proc.stdout
    import numpy as np
    np.testing.assert_allclose(np.load(out), 1.0, rtol=1e-6)


def test_two_ranks_on_one_gpu_is_refused():
    proc = run_mpi(2, "-m", "solvers.pcg", "--matrix", EXAMPLE, "--device", "gpu",
                   env={"CUDA_VISIBLE_DEVICES": os.environ.get("GRAPHSOLVE_ONE_GPU", "0")}, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stderr.count("share the GPU") == 1, proc.stderr


@pytest.mark.parametrize("numbering, expected", [("in order", "dia"), ("at random", "ell")])
def test_one_ranks_gpu_driver_takes_the_slot_formats_and_agrees_with_one_gpu(numbering, expected):
    """The distributed kernels (kernels/dist.cu) over DIA and ELL on one GPU: one rank of COMM_SELF owns every
    row, so no halo; the same iterations and solution as the one-GPU solver."""
    from mpi4py import MPI

    from solvers.distributed import DistributedPCG
    from solvers.pcg import PCG
    A = poisson((30, 28, 26)).tocsr()
    if numbering == "at random":
        order = np.random.default_rng(2).permutation(A.shape[0])
        A = sp.csr_matrix(A[order][:, order])
    b = A @ np.linspace(1.0, 2.0, A.shape[0])
    solver = DistributedPCG(A, [0, A.shape[0]], MPI.COMM_SELF, rtol=1e-9, device="gpu")
    assert solver._impl.format.name == expected
    res = solver.solve(b)
    one_gpu = PCG(A, rtol=1e-9, device="gpu", reorder="none").solve(b)
    assert res.converged and res.iterations == one_gpu.iterations
    assert np.abs(res.x.get() - one_gpu.x.get()).max() <= 1e-9 * np.abs(one_gpu.x.get()).max()
