"""PCG on the CPU with NumPy: the reference every GPU driver is compared to.

Two variants, each the iteration the GPU kernels run (see ``kernels/pcg.cu``):
``classic`` PCG and the ``single-reduction`` (Chronopoulos-Gear) form, with
the same stopping rule and the same breakdown and NaN checks.
"""
import time

import numpy as np

from ..backend import is_device_array
from ..kernels.pcg_ref import stop_reason

from ..errors import DeviceError, InputError
from .result import Reason

VARIANTS = ("classic", "single-reduction")
# Single-reduction is the GPU's choice up to this many rows, where an iteration is latency bound
# (one grid reduction instead of two); above it, its extra neighbour reads make it slower than
# classic. Measured on an H200 (MEASUREMENTS.md): 64^2 and 256^2 6-14% faster, 64^3 14% slower.
SINGLE_REDUCTION_MAX_ROWS = 1 << 17


def resolve_variant(variant, n, device, allowed=VARIANTS):
    """The concrete PCG variant for ``variant`` ("auto" or one of VARIANTS) on ``n`` rows.

    ``auto`` takes the faster variant on ``device`` among ``allowed`` (those the
    preconditioner runs under), else the first of them.
    """
    if variant == "auto":
        faster = "single-reduction" if device == "gpu" and n <= SINGLE_REDUCTION_MAX_ROWS else "classic"
        return faster if faster in allowed else allowed[0]
    if variant not in VARIANTS:
        raise InputError(f"variant must be auto or one of {', '.join(VARIANTS)}, not {variant!r}")
    return variant


def _stop(rnorm, tol, it, maxiter, curvature, finite=True):
    """The stopping rule of every variant (``stop_reason`` in ``kernels/pcg.cu``): a Reason, or None to go on."""
    reason = Reason(stop_reason(rnorm, tol, it, maxiter, curvature, finite))
    return None if reason is Reason.RUNNING else reason


def _bad_curvature(value):
    """NOT_FINITE or BREAKDOWN when the step length's denominator ``value`` is unusable, else None."""
    if not np.isfinite(value):
        return Reason.NOT_FINITE
    return Reason.BREAKDOWN if value <= 0 else None


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
    rz, rnorm, p = None, None, None
    for it in range(maxiter + 1):
        if it:
            q = matvec(p)
            pq = float(dot(p, q))
            reason = _bad_curvature(pq)
            if reason:
                return reason, it - 1, rnorm
            alpha = rz / pq
            x += alpha * p
            r -= alpha * q
            if callback is not None:
                callback(x)
        z = psolve(r)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN and Inf are reported as NOT_FINITE
            rnorm, rz_new = float(np.sqrt(dot(r, r))), float(dot(r, z))
        if history is not None:
            history.append(rnorm)
        reason = _stop(rnorm, tol, it, maxiter, rz_new)
        if reason:
            return reason, it, rnorm
        if it:
            p *= rz_new / rz
            p += z
        else:
            p = z.copy()
        rz = rz_new
    raise AssertionError("unreachable: the stopping rule ends the loop at maxiter")


def pcg_single_reduction(matvec, psolve, b, x, tol, maxiter, callback=None, history=None, reduce=np.asarray,
                         x_is_zero=False):
    """Chronopoulos-Gear PCG in place on ``x``: one reduction of three numbers per iteration.

    Same stopping rule, breakdown and NaN checks as :func:`pcg_iterate`, and
    the same iterates in exact arithmetic; each iteration costs one more
    vector update (``s = A p`` by recurrence).

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
    alpha = gamma_inv = pap = p = s = None
    for it in range(maxiter + 1):
        if it:
            x += alpha * p
            r -= alpha * s
            if callback is not None:
                callback(x)
        u = psolve(r)
        w = matvec(u)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN and Inf are reported as NOT_FINITE
            local = np.array([np.dot(r, r), np.dot(r, u), np.dot(w, u)], dtype=np.float64)
        rr, gamma_new, delta = (float(v) for v in reduce(local))
        rnorm = float(np.sqrt(rr))
        if history is not None:
            history.append(rnorm)
        reason = _stop(rnorm, tol, it, maxiter, gamma_new, np.isfinite(delta))
        if reason:
            return reason, it, rnorm
        # beta = gamma_new / gamma and 1 / alpha = pap / gamma as products with gamma's reciprocal, as
        # the GPU kernels do (kernels/stopping.cu); pap: p.Ap of the next direction, same reduction
        beta = gamma_new * gamma_inv if it else 0.0
        pap = delta - beta * gamma_new * (pap * gamma_inv) if it else delta
        reason = _bad_curvature(pap)
        if reason:
            return reason, it, rnorm
        alpha, gamma_inv = gamma_new / pap, 1.0 / gamma_new
        if it:
            p *= beta
            p += u
            s *= beta
            s += w
        else:
            p, s = u.copy(), w.copy()  # s = A p, kept by recurrence
    raise AssertionError("unreachable: the stopping rule ends the loop at maxiter")


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
