"""Pair force field: one particle type, Lennard-Jones with a cutoff."""
from dataclasses import dataclass

from ..errors import InputError


@dataclass(frozen=True)
class LennardJones:
    """Truncated Lennard-Jones pair potential (LAMMPS ``pair_style lj/cut``).

    ``U(r) = 4 eps ((s/r)^12 - (s/r)^6) - U_shift`` for ``r < rc``, where
    ``U_shift = U(rc)`` when ``shift`` (``pair_modify shift yes``) and 0 otherwise.

    Parameters
    ----------
    epsilon, sigma : float
        Well depth and size.
    rc : float
        Cutoff distance.
    shift : bool
        Shift the energy to zero at the cutoff (forces unchanged).
    """

    epsilon: float = 1.0
    sigma: float = 1.0
    rc: float = 2.5
    shift: bool = False

    def __post_init__(self):
        if not (self.epsilon > 0 and self.sigma > 0):
            raise InputError(f"epsilon and sigma must be positive, got {self.epsilon}, {self.sigma}", "--rc")
        if not self.rc > 0:
            raise InputError(f"cutoff must be positive, got {self.rc}", "--rc")

    @property
    def energy_shift(self):
        """``U_shift`` subtracted from every pair energy."""
        if not self.shift:
            return 0.0
        sr6 = (self.sigma / self.rc) ** 6
        return 4.0 * self.epsilon * sr6 * (sr6 - 1.0)

    def check_box(self, box, skin):
        """Raise :class:`InputError` when the cutoff does not fit the periodic box."""
        half = 0.5 * float(min(box))
        if self.rc > half:
            raise InputError(f"cutoff {self.rc} is larger than half the smallest box edge ({half:.6g})", "--rc")
        if skin < 0:
            raise InputError(f"skin must be >= 0, got {skin}", "--skin")
