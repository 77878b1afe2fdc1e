"""Distributed PCG over MPI ranks (CPU with mpi4py, GPU with NCCL).

Importing this package does not import mpi4py: :mod:`solvers.distributed.launch`
tells from the environment whether the process was started by an MPI
launcher, and MPI is initialised only then.
"""
from .solver import DistributedPCG, DistSolveResult

__all__ = ["DistributedPCG", "DistSolveResult"]
