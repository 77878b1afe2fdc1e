"""Assemble a linear system from files, as the command line describes it."""
import dataclasses
import os

import numpy as np

from ..errors import InputError
from ..mmio import read_columns, read_header, read_matrix
from ..resources import require_host_memory


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
    b: np.ndarray  # (n,), or (n, k) for k right-hand sides
    x0: np.ndarray = None
    x_exact: np.ndarray = None

    @property
    def n(self):
        return self.A.shape[0]

    @property
    def columns(self):
        """How many right-hand sides ``b`` holds as columns (None for one vector)."""
        return self.b.shape[1] if self.b.ndim == 2 else None

    @property
    def nnz(self):
        return int(self.A.nnz)

    def solution_error(self, x):
        """``||x - x_exact|| / ||x_exact||``, or None without a known solution."""
        if self.x_exact is None:
            return None
        x = x.get() if hasattr(x, "get") else np.asarray(x)
        return float(np.linalg.norm(x - self.x_exact) / np.linalg.norm(self.x_exact))


def load_problem(matrix, rhs=None, x0=None):
    """Read and validate matrix, right-hand side and initial guess.

    Without ``rhs``, ``b = A @ ones`` so that the error against the exact
    solution can be reported. ``rhs`` may hold k right-hand sides (an ``(n, k)``
    array, solved together); ``x0`` then holds k initial guesses. Everything is kept in float64, whatever
    precision the solve runs in: the solver rounds it to its precision,
    after scaling a system whose entries lie outside that precision's range.
    Before anything is read, the memory the matrix and vectors take is
    estimated from the header and checked against the memory available.
    """
    header = read_header(matrix)
    n = header.rows
    require_host_memory(8 * n * 3 + 16 * header.entries + 8 * (n + 1),
                        f"a {n:,}-row system with up to {header.entries:,} nonzeros", matrix)
    A = read_matrix(matrix)
    x_exact = None
    if rhs is None:
        x_exact = np.ones(n)
        b = A @ x_exact
    else:
        b = read_columns(rhs, n)
    x0v = read_columns(x0, n) if x0 is not None else None
    if x0v is not None and x0v.shape != b.shape:
        raise InputError(f"initial guess has shape {x0v.shape} but the right-hand side has {b.shape}", x0)
    return Problem(os.path.basename(matrix), A, b, x0v, x_exact)
