"""Pair force fields of one particle type: Lennard-Jones and Morse, each with a cutoff.

A potential states its pair terms once in NumPy (:mod:`solvers.kernels.md_ref`) and
names the device functor of ``kernels/md.cu`` that computes the same terms, with the
parameters that functor reads (:mod:`solvers.kernels.md_params`).
"""
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import InputError
from ..kernels import md_ref

# Rows of the ``work`` array :meth:`_PairPotential.terms` computes in (enough for every potential).
WORK_ROWS = 3


class _PairPotential:
    """What :class:`LennardJones` and :class:`Morse` share: cutoff checks, masking, restart metadata."""

    rc: float
    shift: bool

    def _check_cutoff(self):
        if not self.rc > 0:
            raise InputError(f"cutoff must be positive, got {self.rc}", "--rc")

    def terms(self, rsq, energy=True, work=None):
        """Pair terms ``(F/r, energy, r.F)`` for squared distances (> 0); zero at and beyond the cutoff.

        ``energy`` False: ``(F/r, None, None)``. ``work``: room to compute in, shape
        ``(WORK_ROWS,) + rsq.shape``; without ``energy`` nothing is then allocated.
        """
        return self._terms(rsq, energy=energy, rc_sq=self.rc * self.rc, work=work)

    def _shift(self, shift, energy):
        """The energy shift to use: ``shift``, else this potential's (only worked out when energies are wanted)."""
        if shift is not None:
            return shift
        return self.energy_shift if energy else 0.0

    @property
    def energy_shift(self):
        """Energy subtracted from every pair inside the cutoff (``pair_modify shift yes``), else 0."""
        if not self.shift:
            return 0.0
        return float(self._terms(np.array([self.rc * self.rc]), shift=0.0)[1][0])

    def overlap_energy(self):
        """Half the pair energy at :attr:`overlap_distance`: a particle above it overlaps a neighbour."""
        r = self.overlap_distance
        return 0.5 * float(self._terms(np.array([r * r]), shift=0.0)[1][0])

    def check_box(self, box, skin):
        """Raise :class:`InputError` when the cutoff does not fit the periodic box."""
        half = 0.5 * float(min(box))
        if self.rc > half:
            raise InputError(f"cutoff {self.rc} is larger than half the smallest box edge ({half:.6g})", "--rc")
        if not 0 <= skin < float("inf"):
            raise InputError(f"skin must be >= 0 and finite, got {skin}", "--skin")

    def meta(self):
        """Parameters for a restart file (:func:`from_meta` reads them back)."""
        return {"potential": self.name, **asdict(self)}


@dataclass(frozen=True)
class LennardJones(_PairPotential):
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

    name = "lj"
    functor = "PairLJ"  # kernels/md.cu

    def __post_init__(self):
        if not (self.epsilon > 0 and self.sigma > 0):
            raise InputError(f"epsilon and sigma must be positive, got {self.epsilon}, {self.sigma}", "--epsilon")
        self._check_cutoff()

    @property
    def overlap_distance(self):
        """Closer than sigma / 2 is an overlap."""
        return 0.5 * self.sigma

    def _terms(self, rsq, shift=None, energy=True, rc_sq=np.inf, work=None):
        return md_ref.lj_pair(rsq, self.epsilon, self.sigma, self._shift(shift, energy), energy, rc_sq, work)

    def device_params(self):
        """Field values of the device functor's parameters (``PairLJ`` in kernels/md_params.py)."""
        return {"rc_sq": self.rc ** 2, "sigma_sq": self.sigma ** 2, "eps4": 4.0 * self.epsilon,
                "eps24": 24.0 * self.epsilon, "eshift": self.energy_shift}


@dataclass(frozen=True)
class Morse(_PairPotential):
    """Truncated Morse pair potential (LAMMPS ``pair_style morse``).

    ``U(r) = D0 (exp(-2 a (r - r0)) - 2 exp(-a (r - r0))) - U_shift`` for ``r < rc``.

    Parameters
    ----------
    d0 : float
        Well depth.
    alpha : float
        Stiffness (inverse length).
    r0 : float
        Distance of the minimum.
    rc : float
        Cutoff distance.
    shift : bool
        Shift the energy to zero at the cutoff (forces unchanged).
    """

    d0: float = 1.0
    alpha: float = 5.0
    r0: float = 1.1
    rc: float = 2.5
    shift: bool = False

    name = "morse"
    functor = "PairMorse"  # kernels/md.cu

    def __post_init__(self):
        if not (self.d0 > 0 and self.alpha > 0 and self.r0 > 0):
            raise InputError(f"d0, alpha and r0 must be positive, got {self.d0}, {self.alpha}, {self.r0}",
                             "--morse")
        self._check_cutoff()

    @property
    def overlap_distance(self):
        """Closer than r0 / 2 is an overlap."""
        return 0.5 * self.r0

    def _terms(self, rsq, shift=None, energy=True, rc_sq=np.inf, work=None):
        return md_ref.morse_pair(rsq, self.d0, self.alpha, self.r0, self._shift(shift, energy), energy, rc_sq,
                                 work)

    def device_params(self):
        """Field values of the device functor's parameters (``PairMorse`` in kernels/md_params.py)."""
        return {"rc_sq": self.rc ** 2, "d0": self.d0, "alpha": self.alpha, "r0": self.r0,
                "eshift": self.energy_shift}


POTENTIALS = {cls.name: cls for cls in (LennardJones, Morse)}


def from_meta(meta, source=None):
    """The potential a restart file describes (files without ``potential`` are Lennard-Jones)."""
    fields = dict(meta)
    cls = POTENTIALS.get(fields.pop("potential", "lj"))
    if cls is None:
        raise InputError(f"unknown potential {meta.get('potential')!r}", source)
    try:
        return cls(**{k: fields[k] for k in cls.__dataclass_fields__})
    except KeyError as exc:
        raise InputError(f"restart lacks parameter {exc}", source) from None
