"""What the MPI test modules share: the job's communicator, reductions and the distributed/global problem pair.

Import only after the module-level check that the test runs under an MPI launch.
"""
import pathlib

import numpy as np
from mpi4py import MPI

from solvers.distributed.problem import poisson_distributed, read_distributed
from solvers.gallery import poisson
from solvers.pcg.cpu import VARIANTS  # noqa: F401 - re-exported for parametrisation
from solvers.pcg.problem import load_problem

COMM = MPI.COMM_WORLD
REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "data" / "lap2D_5pt_n100.mtx"


def global_max(value):
    """The largest ``value`` over the job (the same on every rank)."""
    return COMM.allreduce(float(value), op=MPI.MAX)


def problem_pair(matrix, shape):
    """``(p, A, b)``: this rank's share of a problem and the whole matrix and right-hand side.

    ``matrix`` is "lap2D" (the bundled Matrix Market file) or "poisson3d" (``shape``, b = A @ ones).
    """
    if matrix == "lap2D":
        single = load_problem(str(EXAMPLE))
        return read_distributed(COMM, str(EXAMPLE)), single.A, single.b
    A = poisson(shape).tocsr()
    return poisson_distributed(COMM, shape), A, A @ np.ones(A.shape[0])
