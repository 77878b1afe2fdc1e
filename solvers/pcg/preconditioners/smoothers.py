"""Relaxation on ``A x = b`` with the Jacobi-scaled matrix ``D^{-1} A``: weighted Jacobi and Chebyshev.

Both are polynomials in ``D^{-1} A``, which is self-adjoint in the ``A`` inner
product, so a V-cycle that smooths the same way before and after its coarse
correction is a symmetric preconditioner (CG needs one). Both are pointwise, one
thread a row on the GPU; Gauss-Seidel, PyAMG's default, runs row after row (or
colour after colour) and is symmetric only when swept both ways.

Each smoother has two entry points, the two shapes a V-cycle uses: :meth:`from_zero`
(pre-smoothing from ``x = 0``: the first product ``A x`` is skipped) and
:meth:`improve` (post-smoothing of a given ``x``, in place). The Chebyshev
preconditioner is :meth:`ChebyshevSmoother.from_zero` on the finest matrix.
``device_from_zero`` and ``device_improve`` append the same operations, in the
same order, to a :class:`~.device.DeviceProgram` (the GPU apply); there
``device_improve`` smooths one buffer into another, because a product must not
read a vector its own kernel writes (the V-cycle's prolongation writes that buffer). A smoother's
matrix and vectors may be SciPy/NumPy or cupyx/CuPy ones.
"""
import numpy as np

from .base import jacobi_inverse_diagonal
from .spectrum import LANCZOS_STEPS, largest_scaled_eigenvalue

#: Chebyshev interval relative to the estimated largest eigenvalue ``rho`` of ``D^{-1} A``:
#: ``[rho / 30, 1.1 rho]``, PyAMG's ``setup_chebyshev`` defaults (``lower_bound=1/30``,
#: ``upper_bound=1.1``). The 1.1 covers Lanczos' underestimate of ``rho`` (hypre's
#: ``hypre_ParCSRRelax_Cheby_Setup`` takes the same factor, after Adams, Brezina, Hu and
#: Tuminaro, J. Comput. Phys. 188, 2003); below the lower end lie the smooth modes the coarse
#: grid corrects (hypre's default ``cheby_fraction`` puts it at 0.3 of the interval instead).
LOWER_FRACTION = 1.0 / 30.0
SAFETY = 1.1
#: Jacobi weight over the estimated ``rho``: PyAMG's ``('jacobi', {'omega': 4/3})`` smoother
#: (``omega / rho(D^{-1} A)``), the usual damping for smoothing with weighted Jacobi.
JACOBI_OMEGA = 4.0 / 3.0


def _estimate(A, inverse_diagonal, steps, given):
    """``given`` (a float), or the Lanczos estimate of ``rho(D^{-1} A)`` when it is None."""
    return float(given) if given is not None else largest_scaled_eigenvalue(A, inverse_diagonal, steps)


class JacobiSmoother:
    """``sweeps`` steps of ``x += (omega / rho) D^{-1} (b - A x)``.

    Parameters
    ----------
    A : scipy.sparse.csr_matrix
    omega : float
        Weight relative to the estimated largest eigenvalue ``rho`` of ``D^{-1} A``.
    sweeps : int
    steps : int
        Lanczos steps of the estimate.
    lambda_max : float, optional
        The estimate of ``rho(D^{-1} A)`` when the caller has one already (an AMG set-up
        that smoothed its prolongator with it); else it is estimated here.
    """

    name = "jacobi"

    def __init__(self, A, omega=JACOBI_OMEGA, sweeps=1, steps=LANCZOS_STEPS, user="Jacobi smoother",
                 lambda_max=None):
        self.A = A
        self.inverse_diagonal = jacobi_inverse_diagonal(A.diagonal(), user=user).astype(A.dtype)
        self.lambda_max = _estimate(A, self.inverse_diagonal, steps, lambda_max)
        self.sweeps = int(sweeps)
        self.weight = omega / self.lambda_max
        self._scaled = (self.weight * self.inverse_diagonal).astype(A.dtype)

    def from_zero(self, b):
        """The smoothed solution of ``A x = b`` from ``x = 0``."""
        x = self._scaled * b
        for _ in range(self.sweeps - 1):
            x += self._scaled * (b - self.A @ x)
        return x

    def improve(self, x, b):
        """Smooth ``x`` in place."""
        for _ in range(self.sweeps):
            x += self._scaled * (b - self.A @ x)

    def device_from_zero(self, program, b, x):
        """Append :meth:`from_zero` of the device vector ``b`` into ``x`` to ``program``."""
        if self.sweeps == 1:
            program.scaled_add(program.vector(self._scaled), b, x, accumulate=False)
            return
        start = program.scratch(self, "start", x.size)
        program.scaled_add(program.vector(self._scaled), b, start, accumulate=False)
        self._device_sweeps(program, b, start, x, self.sweeps - 1)

    def device_improve(self, program, b, start, x):
        """Append :meth:`improve` of the device vector ``start`` into ``x`` (another buffer) to ``program``."""
        self._device_sweeps(program, b, start, x, self.sweeps)

    def _device_sweeps(self, program, b, start, x, count):
        """``count`` sweeps from ``start``, the last into ``x``: each sweep reads its input at
        neighbouring rows, so it writes another buffer (two scratch vectors in turn)."""
        A, scaled = program.matrix(self.A), program.vector(self._scaled)
        spare = [program.scratch(self, f"sweep {k}", x.size) for k in range(min(count - 1, 2))]
        source = start
        for k in range(count):
            target = x if k == count - 1 else (spare[0] if source is not spare[0] else spare[1])
            program.jacobi_sweep(A, source, b, scaled, target)
            source = target

    def details(self):
        return {"smoother": self.name, "sweeps": self.sweeps, "weight": self.weight, "lambda_max": self.lambda_max}


class ChebyshevSmoother:
    """Chebyshev iteration of ``degree`` steps on ``D^{-1} A x = D^{-1} b`` over ``[lower, upper]``.

    The residual after it is ``C(D^{-1} A)`` times the one before, with ``C`` the
    degree-``degree`` Chebyshev polynomial scaled to ``[lower, upper]`` and ``C(0) = 1``
    (the polynomial PyAMG's ``chebyshev_polynomial_coefficients`` gives, here on the
    Jacobi-scaled matrix, as in hypre's scaled variant). It runs as the three-term
    recurrence (Saad, Iterative Methods for Sparse Linear Systems, 2nd ed., Alg. 12.1),
    stable at any degree where monomial coefficients are not, and one fused kernel a
    step on the GPU: ``d = c1 d + c2 D^{-1} r``, ``x += d``, ``r -= A d``.

    Parameters
    ----------
    A : scipy.sparse.csr_matrix
    degree : int
        Degree of the residual polynomial: ``degree`` products with ``A`` to
        improve an ``x``, one fewer from ``x = 0``.
    lower_fraction, safety : float
        The interval is ``[lower_fraction * rho, safety * rho]`` for the estimate
        ``rho`` of the largest eigenvalue of ``D^{-1} A``.
    steps : int
        Lanczos steps of the estimate.
    lambda_max : float, optional
        As for :class:`JacobiSmoother`.
    """

    name = "chebyshev"

    def __init__(self, A, degree=3, lower_fraction=LOWER_FRACTION, safety=SAFETY, steps=LANCZOS_STEPS,
                 user="Chebyshev smoother", lambda_max=None):
        self.A = A
        self.inverse_diagonal = jacobi_inverse_diagonal(A.diagonal(), user=user).astype(A.dtype)
        self.lambda_max = _estimate(A, self.inverse_diagonal, steps, lambda_max)
        self.degree = int(degree)
        self.lower, self.upper = lower_fraction * self.lambda_max, safety * self.lambda_max
        theta, delta = (self.upper + self.lower) / 2, (self.upper - self.lower) / 2
        # The recurrence's scalars, the same for every application: d_0 = r / theta, then
        # d_k = c1[k] d_{k-1} + c2[k] D^{-1} r_k with rho_k = 1 / (2 sigma - rho_{k-1}).
        sigma = theta / delta
        rho = 1.0 / sigma
        self.first = 1.0 / theta
        self.coefficients = []
        for _ in range(self.degree - 1):
            rho_next = 1.0 / (2.0 * sigma - rho)
            self.coefficients.append((rho_next * rho, 2.0 * rho_next / delta))
            rho = rho_next

    def _iterate(self, x, r):
        """The recurrence from ``x`` and its scaled residual ``r = D^{-1} (b - A x)`` (overwritten)."""
        d = self.first * r
        x += d
        for c1, c2 in self.coefficients:
            r -= self.inverse_diagonal * (self.A @ d)
            d *= c1
            d += c2 * r
            x += d
        return x

    def from_zero(self, b):
        """The smoothed solution of ``A x = b`` from ``x = 0``."""
        return self._iterate(np.zeros_like(b), self.inverse_diagonal * b)

    def improve(self, x, b):
        """Smooth ``x`` in place."""
        self._iterate(x, self.inverse_diagonal * (b - self.A @ x))

    def device_from_zero(self, program, b, x):
        """Append :meth:`from_zero` of the device vector ``b`` into ``x`` to ``program``.

        The start ``d = first D^{-1} b`` is pointwise: the first step's kernel forms it
        where its product reads it instead of a launch of its own storing it.
        """
        A, dinv = program.matrix(self.A), program.vector(self.inverse_diagonal)
        d, rs = self._device_vectors(program, x.size)
        if not self.coefficients:  # degree 1: x = d, no step
            program.chebyshev_begin(b, dinv, self.first, x, d[0], rs)
            return
        c1, c2 = self.coefficients[0]
        program.chebyshev_start_step(A, b, dinv, self.first, d[1], rs, x, c1, c2)
        for k, (c1, c2) in enumerate(self.coefficients[1:], start=1):
            program.chebyshev_step(A, dinv, d[k % 2], d[(k + 1) % 2], rs, x, x, c1, c2)

    def device_improve(self, program, b, start, x):
        """Append :meth:`improve` of the device vector ``start`` into ``x`` (another buffer) to ``program``.

        The residual's kernel also starts the recurrence; the first step adds both
        its own and that start's correction to ``x``.
        """
        A, dinv = program.matrix(self.A), program.vector(self.inverse_diagonal)
        d, rs = self._device_vectors(program, x.size)
        program.chebyshev_residual(A, start, b, dinv, self.first, d[0], rs, None if self.coefficients else x)
        self._device_steps(program, A, dinv, d, rs, start, x)

    def _device_vectors(self, program, n):
        d = [program.scratch(self, "d0", n), program.scratch(self, "d1", n)]
        return d, program.scratch(self, "scaled residual", n)

    def _device_steps(self, program, A, dinv, d, rs, start, x):
        """The recurrence's steps after :meth:`device_improve`'s residual kernel, the first from ``start``
        (adding the start's correction too), each into ``x``."""
        for k, (c1, c2) in enumerate(self.coefficients):
            program.chebyshev_step(A, dinv, d[k % 2], d[(k + 1) % 2], rs, start if k == 0 else x, x, c1, c2,
                                   add_old=k == 0)

    def details(self):
        return {"smoother": self.name, "degree": self.degree, "interval": [self.lower, self.upper],
                "lambda_max": self.lambda_max}
