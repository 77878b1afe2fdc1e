"""Distributed PCG on the CPU: NumPy buffers, mpi4py messages.

Both variants run the single-process iterations of :mod:`solvers.pcg.cpu`
with inner products summed over ranks: ``classic`` (two allreduces per
iteration) and ``single-reduction`` (one); the GPU path runs the same
recurrences.
"""
import time

import numpy as np

from ..pcg.cpu import pcg_iterate, pcg_single_reduction
from .comm import HostComm


class DistCPUPCG:
    """One rank's PCG on its rows (see :class:`~solvers.distributed.solver.DistributedPCG`).

    Parameters
    ----------
    matrix : LocalMatrix
    inverse_diagonal : ndarray or None
        Jacobi scaling of the owned rows; None for no preconditioner.
    comm : mpi4py communicator
    variant : {"classic", "single-reduction"}
    """

    device = "cpu"
    mode = "numpy"
    loop_time = 0.0  # seconds of the last solve's iterations

    def __init__(self, matrix, inverse_diagonal, comm, variant, dtype):
        self.matrix = matrix
        self.inverse_diagonal = inverse_diagonal
        self.variant = variant
        self.dtype = np.dtype(dtype)
        self.host = HostComm(comm, matrix.plan)
        self._halo = np.empty(matrix.plan.halo_size, dtype=self.dtype)

    @property
    def communication_time(self):
        return self.host.timer.seconds

    def matvec(self, v):
        """Owned rows of ``A v``; the halo travels while the local block is multiplied."""
        m = self.matrix
        self.host.start_halo(v, self._halo)
        y = m.local @ v
        self.host.finish_halo()
        if m.boundary_rows.size:
            y[m.boundary_rows] += m.halo @ self._halo
        return y

    def psolve(self, r):
        return r.copy() if self.inverse_diagonal is None else self.inverse_diagonal * r

    def norm(self, v):
        return float(np.sqrt(self.host.dot(v, v)))

    def solve(self, b, x0, tol, maxiter, record_history):
        """Return ``(x, reason, iterations, rnorm, history)`` for the owned rows."""
        history = [] if record_history else None
        t0 = time.perf_counter()
        x_is_zero = not self.host.comm.allreduce(x0 is not None and bool(np.any(x0)))
        x = np.zeros_like(b) if x_is_zero else np.array(x0, dtype=self.dtype)
        if self.variant == "single-reduction":
            result = pcg_single_reduction(self.matvec, self.psolve, b, x, tol, maxiter, history=history,
                                          reduce=self.host.allreduce, x_is_zero=x_is_zero)
        elif x_is_zero:
            result = pcg_iterate(self.matvec, self.psolve, b, x, tol, maxiter, None, history, self.host.dot)
        else:
            # pcg_iterate decides "x0 is zero" from the local part alone, which ranks may
            # disagree on; solving for the correction from zero keeps them in step.
            d = np.zeros_like(b)
            result = pcg_iterate(self.matvec, self.psolve, b - self.matvec(x), d, tol, maxiter, None,
                                 history, self.host.dot)
            x += d
        self.loop_time = time.perf_counter() - t0
        return (x, *result, None if history is None else np.array(history))

    def true_residual_norm(self, b, x):
        return self.norm(b - self.matvec(x))
