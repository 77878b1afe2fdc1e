"""Assemble a linear system from files, as the command line describes it."""
import dataclasses
import os

import numpy as np

from ..mmio import read_matrix, read_vector


@dataclasses.dataclass
class Problem:
    """A validated system ``A x = b``.

    Attributes
    ----------
    x_exact : ndarray or None
        The known solution when ``b`` was made as ``A @ ones``.
    """

    name: str
    A: object
    b: np.ndarray
    x0: np.ndarray = None
    x_exact: np.ndarray = None

    @property
    def n(self):
        return self.A.shape[0]

    @property
    def nnz(self):
        return int(self.A.nnz)

    def solution_error(self, x):
        """``||x - x_exact|| / ||x_exact||``, or None without a known solution."""
        if self.x_exact is None:
            return None
        x = x.get() if hasattr(x, "get") else np.asarray(x)
        return float(np.linalg.norm(x - self.x_exact) / np.linalg.norm(self.x_exact))


def load_problem(matrix, rhs=None, x0=None, dtype=np.float64):
    """Read and validate matrix, right-hand side and initial guess.

    Without ``rhs``, ``b = A @ ones`` so that the error against the exact
    solution can be reported.
    """
    A = read_matrix(matrix, dtype=dtype)
    n = A.shape[0]
    x_exact = None
    if rhs is None:
        x_exact = np.ones(n, dtype=dtype)
        b = A @ x_exact
    else:
        b = read_vector(rhs, n=n, dtype=dtype)
    x0v = read_vector(x0, n=n, dtype=dtype) if x0 is not None else None
    return Problem(os.path.basename(matrix), A, b, x0v, x_exact)
