"""Chebyshev polynomial preconditioning: ``M^{-1} = p(D^{-1} A) D^{-1}``."""
from ...errors import InputError
from ..cpu import VARIANTS
from .base import Preconditioner
from .smoothers import LOWER_FRACTION, SAFETY, ChebyshevSmoother
from .spectrum import LANCZOS_STEPS


def check_degree(degree):
    """``degree`` as an int >= 1, else :class:`InputError`."""
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise InputError(f"Chebyshev degree must be an integer >= 1, got {degree!r}")
    return degree


class Chebyshev(Preconditioner):
    """``degree`` steps of the Chebyshev iteration from zero on the Jacobi-scaled system.

    ``M^{-1} r`` is what :class:`~solvers.pcg.preconditioners.smoothers.ChebyshevSmoother`
    makes of ``A z = r`` from ``z = 0``: ``degree - 1`` products with ``A`` an
    application, fixed coefficients, so ``M`` is the same symmetric positive
    definite operator at every iteration (CG needs that). The interval comes from
    a Lanczos estimate of the largest eigenvalue of ``D^{-1} A`` at set-up, on the
    device for a GPU solve. On the GPU it runs under classic PCG, one kernel a step.

    Parameters
    ----------
    degree : int
        Degree of the residual polynomial (3).
    lower_fraction, safety : float
        Interval ``[lower_fraction * rho, safety * rho]`` (1/30 and 1.1, PyAMG's).
    lanczos_steps : int
        Steps of the eigenvalue estimate (10).
    """

    name = "chebyshev"
    variants = {"cpu": VARIANTS, "gpu": ("classic",)}

    def __init__(self, degree=3, *, lower_fraction=LOWER_FRACTION, safety=SAFETY, lanczos_steps=LANCZOS_STEPS):
        self.degree = check_degree(degree)
        if not 0 < lower_fraction < 1 <= safety:
            raise InputError(f"Chebyshev interval needs 0 < lower_fraction < 1 <= safety, "
                             f"got {lower_fraction} and {safety}")
        if isinstance(lanczos_steps, bool) or not isinstance(lanczos_steps, int) or lanczos_steps < 1:
            raise InputError(f"lanczos_steps must be an integer >= 1, got {lanczos_steps!r}")
        self.lower_fraction, self.safety, self.lanczos_steps = lower_fraction, safety, lanczos_steps

    def _setup(self, A):
        self.smoother = ChebyshevSmoother(A, self.degree, self.lower_fraction, self.safety, self.lanczos_steps,
                                          user="Chebyshev preconditioner")

    def apply(self, r):
        return self.smoother.from_zero(r)

    def device_apply(self, program):
        self.smoother.device_from_zero(program, program.input, program.output)

    def details(self):
        s = self.smoother
        return {"degree": self.degree, "lambda_max_estimate": s.lambda_max, "interval": [s.lower, s.upper],
                "lanczos_steps": self.lanczos_steps, "setup_time_s": self.setup_time}

    def describe(self):
        s = self.smoother
        return [("chebyshev", f"degree {self.degree} in D^-1 A on [{s.lower:.4g}, {s.upper:.4g}] "
                              f"(lambda_max ~ {s.lambda_max:.4g}, {self.lanczos_steps} Lanczos steps)")]
