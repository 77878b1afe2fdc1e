"""Preconditioned conjugate gradients: CPU reference and GPU graph drivers.

Run ``python -m solvers.pcg --help`` for the command line.
"""
from .api import cg
from .batched import BatchedPCG, BatchResult
from .preconditioners import AMG, Chebyshev, Identity, Jacobi, Preconditioner
from .result import Reason, SolveResult
from .solver import PCG

__all__ = ["cg", "PCG", "BatchedPCG", "BatchResult", "Reason", "SolveResult",
           "Preconditioner", "Identity", "Jacobi", "Chebyshev", "AMG"]
