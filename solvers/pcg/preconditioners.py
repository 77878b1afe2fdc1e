"""Preconditioners for PCG, by name.

Each one is set up from the matrix once. ``apply(r)`` is the CPU action
``z = M^{-1} r``; ``inverse_diagonal`` (or ``None``) is what the fused GPU
kernels consume. A new kind (Chebyshev, AMG) adds a class here and, for the
GPU, a kernel hook.
"""
import numpy as np
import scipy.sparse as sp

from ..errors import InputError


def jacobi_inverse_diagonal(d, first_row=0):
    """``1 / d`` for a positive diagonal ``d`` (NumPy or CuPy), else :class:`InputError`.

    ``first_row`` is the global number of ``d[0]`` (a rank's first row), for the message.
    """
    bad = (~(d > 0)).nonzero()[0]
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"Jacobi preconditioner needs a positive diagonal, but {int(bad.size)} diagonal "
            f"entries are zero or negative (first: row {first_row + i + 1}, a_ii = {float(d[i]):.6g}); "
            "use --precond none or fix the matrix")
    return 1.0 / d


class Identity:
    """No preconditioning (``M = I``)."""

    name = "none"
    inverse_diagonal = None

    def __init__(self, A):
        pass

    def apply(self, r):
        return r.copy()


class Jacobi:
    """Diagonal (Jacobi) preconditioning, ``M = diag(A)``; the diagonal must be positive."""

    name = "jacobi"

    def __init__(self, A):
        d = np.asarray(A.diagonal())
        self.inverse_diagonal = jacobi_inverse_diagonal(d).astype(d.dtype)

    def apply(self, r):
        return self.inverse_diagonal * r


PRECONDITIONERS = {cls.name: cls for cls in (Identity, Jacobi)}


def make_preconditioner(name, A):
    """Build the named preconditioner for ``A`` (a sparse or dense matrix)."""
    if name not in PRECONDITIONERS:
        raise InputError(f"unknown preconditioner {name!r}; choose from {', '.join(PRECONDITIONERS)}")
    if name != "none" and not (sp.issparse(A) or isinstance(A, np.ndarray)):
        raise InputError(f"preconditioner {name!r} needs an explicit matrix, not an operator")
    return PRECONDITIONERS[name](A)
