"""PCG on the CPU with NumPy: the reference every GPU driver is compared to.

Two variants, each the iteration the GPU kernels run (see ``kernels/pcg.cu``):
``classic`` PCG and the ``single-reduction`` (Chronopoulos-Gear) form, with
the same stopping rule and the same breakdown and NaN checks.
"""
import time

import numpy as np

from ..backend import is_device_array
from ..errors import DeviceError, InputError
from .result import Reason

VARIANTS = ("classic", "single-reduction")
# Single-reduction is the GPU's choice up to this many rows, where an iteration is latency bound
# (one kernel instead of two); above it, its extra neighbour reads make it slower than classic.
# Measured on an H200 (MEASUREMENTS.md): 64^2 and 256^2 ~15% faster, 64^3 ~20% slower.
SINGLE_REDUCTION_MAX_ROWS = 1 << 17


def resolve_variant(variant, n, device):
    """The concrete PCG variant for ``variant`` ("auto" or one of VARIANTS) on ``n`` rows."""
    if variant == "auto":
        return "single-reduction" if device == "gpu" and n <= SINGLE_REDUCTION_MAX_ROWS else "classic"
    if variant not in VARIANTS:
        raise InputError(f"variant must be auto or one of {', '.join(VARIANTS)}, not {variant!r}")
    return variant


def pcg_iterate(matvec, psolve, b, x, tol, maxiter, callback=None, history=None, dot=np.dot):
    """Run preconditioned CG in place on ``x``.

    Parameters
    ----------
    matvec, psolve : callable
        ``A @ v`` and ``M^{-1} v``.
    b : ndarray
        Right-hand side.
    x : ndarray
        Initial guess, overwritten by the solution.
    tol : float
        Absolute threshold: stop when ``||r|| <= tol``.
    maxiter : int
        Maximum number of updates of ``x``.
    callback : callable, optional
        ``callback(x)`` after each update, as in SciPy.
    history : list, optional
        Receives ``||r||`` before the first and after every update.
    dot : callable
        Inner product; a distributed run passes one that sums over ranks.

    Returns
    -------
    (Reason, int, float)
        Stop reason, iterations done, final recursive residual norm.
    """
    r = b - matvec(x) if np.any(x) else b.copy()
    rnorm = float(np.sqrt(dot(r, r)))
    if history is not None:
        history.append(rnorm)
    if not np.isfinite(rnorm):
        return Reason.NOT_FINITE, 0, rnorm
    if rnorm <= tol:
        return Reason.CONVERGED, 0, rnorm
    z = psolve(r)
    rz = float(dot(r, z))
    if not np.isfinite(rz):
        return Reason.NOT_FINITE, 0, rnorm
    if rz <= 0:
        return Reason.BREAKDOWN, 0, rnorm
    p = z.copy()
    for it in range(1, maxiter + 1):
        q = matvec(p)
        pq = float(dot(p, q))
        if not np.isfinite(pq):
            return Reason.NOT_FINITE, it - 1, rnorm
        if pq <= 0:
            return Reason.BREAKDOWN, it - 1, rnorm
        alpha = rz / pq
        x += alpha * p
        r -= alpha * q
        if callback is not None:
            callback(x)
        rnorm = float(np.sqrt(dot(r, r)))
        if history is not None:
            history.append(rnorm)
        if not np.isfinite(rnorm):
            return Reason.NOT_FINITE, it, rnorm
        if rnorm <= tol:
            return Reason.CONVERGED, it, rnorm
        if it == maxiter:
            break
        z = psolve(r)
        rz_new = float(dot(r, z))
        if not np.isfinite(rz_new):
            return Reason.NOT_FINITE, it, rnorm
        if rz_new <= 0:
            return Reason.BREAKDOWN, it, rnorm
        beta = rz_new / rz
        rz = rz_new
        p *= beta
        p += z
    return Reason.MAX_ITERATIONS, maxiter, rnorm


def pcg_single_reduction(matvec, psolve, b, x, tol, maxiter, callback=None, history=None, reduce=np.asarray,
                         x_is_zero=False):
    """Chronopoulos-Gear PCG in place on ``x``: one reduction of three numbers per iteration.

    Same stopping rule, breakdown and NaN checks as :func:`pcg_iterate`, and
    the same iterates in exact arithmetic; each iteration costs one more
    vector update (``s = A p`` by recurrence) and the last one a spare
    product.

    Parameters
    ----------
    matvec, psolve, b, x, tol, maxiter, callback, history
        As for :func:`pcg_iterate`.
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
        if callback is not None:
            callback(x)
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


class CPUPCG:
    """Set-up-once PCG on NumPy/SciPy data (one instance per matrix)."""

    device = "cpu"
    mode = "numpy"
    mode_note = None

    def __init__(self, A, preconditioner, dtype, variant="classic"):
        self.A = A
        self.M = preconditioner
        self.dtype = np.dtype(dtype)
        self.variant = variant

    @property
    def shape(self):
        return self.A.shape

    def update_values(self, A):
        self.A = A

    def check_vector(self, v, name):
        """Return ``v`` as a 1-D host array of the solver's dtype, or raise InputError."""
        if is_device_array(v):
            raise DeviceError(f"{name} is a GPU array but the solver runs on the CPU")
        v = np.asarray(v)
        if v.ndim == 2 and 1 in v.shape:
            v = v.reshape(-1)
        if v.shape != (self.shape[0],):
            raise InputError(f"{name} has shape {v.shape}, expected ({self.shape[0]},)")
        if np.iscomplexobj(v) or not np.issubdtype(v.dtype, np.number):
            raise InputError(f"{name} must be real, got dtype {v.dtype}")
        return v.astype(self.dtype, copy=False)

    def norm(self, v):
        return float(np.linalg.norm(v))

    def solve(self, b, x0, tol, maxiter, callback, record_history, on_progress=None):
        """Return ``(x, reason, iterations, rnorm, history)``.

        ``on_progress(iteration, rnorm)`` is called after every iteration.
        """
        b = np.asarray(b, dtype=self.dtype)
        x = np.zeros_like(b) if x0 is None else np.array(x0, dtype=self.dtype, copy=True)
        history = [] if (record_history or on_progress is not None) else None
        if on_progress is not None:
            user_callback = callback

            def callback(xk):
                if user_callback is not None:
                    user_callback(xk)
                on_progress(len(history), history[-1])  # residual of the previous iteration
        t0 = time.perf_counter()
        if self.variant == "single-reduction":
            reason, its, rnorm = pcg_single_reduction(self.A.dot, self.M.apply, b, x, tol, maxiter, callback,
                                                      history, x_is_zero=x0 is None)
        else:
            reason, its, rnorm = pcg_iterate(self.A.dot, self.M.apply, b, x, tol, maxiter, callback, history)
        self.last_loop_time = time.perf_counter() - t0
        if not record_history:
            history = None
        return x, reason, its, rnorm, (np.array(history) if history is not None else None)

    def true_residual_norm(self, b, x):
        return float(np.linalg.norm(np.asarray(b, dtype=self.dtype) - self.A.dot(x)))
