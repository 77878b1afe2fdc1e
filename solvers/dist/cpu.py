"""Distributed PCG on the CPU: NumPy buffers, mpi4py messages.

``classic`` runs the reference iteration :func:`solvers.pcg.cpu.pcg_iterate`
with a summing dot product. ``single-reduction`` is the Chronopoulos-Gear
form of PCG, which computes all three inner products of an iteration after
one matrix-vector product and so needs one allreduce per iteration instead
of several; the GPU path runs the same recurrences.
"""
import time

import numpy as np

from ..pcg.cpu import pcg_iterate
from ..pcg.result import Reason
from .comm import HostComm

VARIANTS = ("classic", "single-reduction")


def pcg_single_reduction(matvec, psolve, b, x, tol, maxiter, history=None, reduce=np.asarray,
                         x_is_zero=False):
    """Chronopoulos-Gear PCG in place on ``x``: one reduction of three numbers per iteration.

    Same stopping rule, breakdown and NaN checks and iteration count as
    :func:`~solvers.pcg.cpu.pcg_iterate`; each iteration costs one more
    vector update (``s = A p`` by recurrence) and the last one a spare
    product.

    Parameters
    ----------
    matvec, psolve, b, x, tol, maxiter, history
        As for :func:`~solvers.pcg.cpu.pcg_iterate`.
    reduce : callable
        ``reduce(local)`` sums a float64 array of partial inner products over ranks.
    x_is_zero : bool
        The caller knows that ``x`` is zero on every rank (skips ``A x``).

    Returns
    -------
    (Reason, int, float)
    """
    r = b.copy() if x_is_zero else b - matvec(x)
    u = psolve(r)
    w = matvec(u)

    def reduced():
        with np.errstate(invalid="ignore", over="ignore"):  # NaN and Inf are reported as NOT_FINITE
            local = np.array([np.dot(r, r), np.dot(r, u), np.dot(w, u)], dtype=np.float64)
        rr, g, d = reduce(local)
        return float(np.sqrt(rr)), float(g), float(d)

    rnorm, gamma, delta = reduced()
    if history is not None:
        history.append(rnorm)
    if not np.isfinite(rnorm):
        return Reason.NOT_FINITE, 0, rnorm
    if rnorm <= tol:
        return Reason.CONVERGED, 0, rnorm
    if not (np.isfinite(gamma) and np.isfinite(delta)):
        return Reason.NOT_FINITE, 0, rnorm
    if gamma <= 0 or delta <= 0:
        return Reason.BREAKDOWN, 0, rnorm
    alpha = gamma / delta          # delta = p.Ap for p = u
    p, s = u.copy(), w.copy()      # s = A p, kept by recurrence
    for it in range(1, maxiter + 1):
        x += alpha * p
        r -= alpha * s
        u = psolve(r)
        w = matvec(u)
        rnorm, gamma_new, delta = reduced()
        if history is not None:
            history.append(rnorm)
        if not np.isfinite(rnorm):
            return Reason.NOT_FINITE, it, rnorm
        if rnorm <= tol:
            return Reason.CONVERGED, it, rnorm
        if it == maxiter:
            break
        if not (np.isfinite(gamma_new) and np.isfinite(delta)):
            return Reason.NOT_FINITE, it, rnorm
        if gamma_new <= 0:
            return Reason.BREAKDOWN, it, rnorm
        beta = gamma_new / gamma
        pap = delta - beta * gamma_new / alpha   # p.Ap of the next direction, from the same reduction
        if not np.isfinite(pap):
            return Reason.NOT_FINITE, it, rnorm
        if pap <= 0:
            return Reason.BREAKDOWN, it, rnorm
        alpha, gamma = gamma_new / pap, gamma_new
        p *= beta
        p += u
        s *= beta
        s += w
    return Reason.MAX_ITERATIONS, maxiter, rnorm


class DistCPUPCG:
    """One rank's PCG on its rows (see :class:`~solvers.dist.solver.DistributedPCG`).

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
            result = pcg_single_reduction(self.matvec, self.psolve, b, x, tol, maxiter, history,
                                          self.host.allreduce, x_is_zero)
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
