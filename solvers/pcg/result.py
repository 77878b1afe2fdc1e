"""The outcome of one PCG solve, shared by every device and driver."""
import dataclasses
import enum
import math

import numpy as np

#: A solve counts as converged only when the true residual ``||b - A x||``, recomputed from the
#: returned ``x``, is at most this many times the tolerance. The recursive residual the iteration
#: stops on drifts from the true one through rounding; in float64 the two agree to well within this
#: factor, while in float32 a tolerance below what the precision can reach stops with a true
#: residual tens to thousands of times the tolerance.
TRUE_RESIDUAL_SLACK = 2.0


class Reason(enum.IntEnum):
    """Why a solve stopped. The values below 5 are the codes the GPU status word holds."""

    RUNNING = 0
    CONVERGED = 1
    MAX_ITERATIONS = 2
    BREAKDOWN = 3      # p.Ap <= 0 or r.z <= 0: matrix or preconditioner not positive definite
    NOT_FINITE = 4     # NaN or Inf appeared in the recurrences
    INACCURATE = 5     # set on the host: the recursion converged, the true residual does not confirm it

    @property
    def label(self):
        return {
            Reason.RUNNING: "running",
            Reason.CONVERGED: "converged",
            Reason.MAX_ITERATIONS: "max iterations reached",
            Reason.BREAKDOWN: "breakdown (matrix or preconditioner not positive definite)",
            Reason.NOT_FINITE: "NaN or Inf encountered",
            Reason.INACCURATE: "the recursive residual converged, the true residual is above the tolerance "
                               "(precision limit)",
        }[self]

    def info(self, iterations):
        """SciPy's ``info``: 0 converged, iterations when not converged, < 0 breakdown."""
        if self is Reason.CONVERGED:
            return 0
        if self in (Reason.MAX_ITERATIONS, Reason.INACCURATE):
            return max(int(iterations), 1)
        return -1 if self is Reason.BREAKDOWN else -2


REASON_OF_CODE = {int(r): r for r in Reason}


def confirmed(reason, true_residual_norm, tolerance):
    """``reason``, unless the true residual contradicts it (then INACCURATE or NOT_FINITE).

    Parameters
    ----------
    reason : Reason
        What the iteration decided.
    true_residual_norm, tolerance : float
        ``||b - A x||`` recomputed from the returned ``x``, and the absolute threshold.
    """
    if reason is not Reason.CONVERGED:
        return reason
    if not math.isfinite(true_residual_norm):
        return Reason.NOT_FINITE
    return reason if true_residual_norm <= TRUE_RESIDUAL_SLACK * tolerance else Reason.INACCURATE


def confirmed_each(status, true_residual_norms, tolerances):
    """:func:`confirmed` of many solves at once: a list of Reason from their status codes (arrays)."""
    status = np.asarray(status, dtype=np.int64).copy()
    true_residual_norms = np.asarray(true_residual_norms, dtype=np.float64)
    converged = status == Reason.CONVERGED
    finite = np.isfinite(true_residual_norms)
    status[converged & ~finite] = Reason.NOT_FINITE
    status[converged & finite & (true_residual_norms > TRUE_RESIDUAL_SLACK * np.asarray(tolerances))] = \
        Reason.INACCURATE
    # a lookup, not Reason(code): the enum's call costs about 0.4 us, 4 ms for a batch of 10,000
    return [REASON_OF_CODE[c] for c in status.tolist()]


@dataclasses.dataclass
class SolveResult:
    """Result of :meth:`solvers.PCG.solve`.

    Attributes
    ----------
    x : array
        Solution (NumPy on the CPU, CuPy on the GPU).
    reason : Reason
    iterations : int
        Number of PCG updates of ``x``.
    residual_norm : float
        ``||r||`` of the recurrence at exit.
    true_residual_norm : float
        ``||b - A x||`` recomputed at exit.
    b_norm, tolerance : float
        ``||b||`` and the absolute stopping threshold ``max(atol, rtol*||b||)``.
    setup_time, solve_time : float
        Seconds spent setting up (once per solver object) and in this solve
        (copies in, iterations, true residual).
    loop_time : float
        Seconds of the iteration loop alone (graph launch to synchronisation on the GPU).
    capture_time : float
        Seconds this solve spent capturing and instantiating the graph (a solver's
        first GPU solve; 0 when the graph was reused): part of ``solve_time``, not of ``loop_time``.
    device, mode : str
        Where and how it ran; ``mode_note`` says why when chosen automatically.
    history : ndarray or None
        Recursive residual norm per iteration (index 0 is the initial residual).
    """

    x: object
    reason: Reason
    iterations: int
    residual_norm: float
    true_residual_norm: float
    b_norm: float
    tolerance: float
    setup_time: float
    solve_time: float
    device: str
    mode: str
    loop_time: float = None
    capture_time: float = 0.0
    mode_note: str = None
    history: np.ndarray = None

    @property
    def info(self):
        return self.reason.info(self.iterations)

    @property
    def converged(self):
        return self.reason is Reason.CONVERGED

    @property
    def relative_residual(self):
        """True residual over ``||b||`` (the absolute residual when ``b`` is zero)."""
        return self.true_residual_norm / self.b_norm if self.b_norm > 0 else self.true_residual_norm

    @property
    def time_per_iteration(self):
        """Loop time over iterations."""
        return self.loop_time / self.iterations if self.iterations else float("nan")
