"""Integrators: velocity Verlet (NVE) and Langevin dynamics (NVT)."""
import math
from dataclasses import dataclass

from ..errors import InputError


@dataclass(frozen=True)
class VelocityVerlet:
    """Velocity Verlet, constant NVE (LAMMPS ``fix nve``).

    Parameters
    ----------
    dt : float
        Timestep (lj time units).
    """

    dt: float = 0.005

    def __post_init__(self):
        if not self.dt > 0:
            raise InputError(f"timestep must be positive, got {self.dt}", "--dt")
        if not math.isfinite(self.dt):
            raise InputError(f"timestep must be finite, got {self.dt}", "--dt")

    @property
    def langevin(self):
        """False: no thermostat force."""
        return False


@dataclass(frozen=True)
class Langevin(VelocityVerlet):
    """Velocity Verlet plus the Langevin force of LAMMPS ``fix langevin``.

    The random force uses Philox4x32-10 keyed by ``seed`` with counter
    (particle id, step): a step is a pure function of the state, so it can be
    captured in a CUDA graph and a run is reproducible (and restartable).

    Parameters
    ----------
    dt : float
    t_target : float
        Target temperature.
    damp : float
        Damping time (1/friction).
    seed : int
        Key of the random stream (0 <= seed < 2**64).
    """

    t_target: float = 1.0
    damp: float = 1.0
    seed: int = 1

    def __post_init__(self):
        super().__post_init__()
        if not self.t_target >= 0:
            raise InputError(f"target temperature must be >= 0, got {self.t_target}", "--t-target")
        if not self.damp > 0:
            raise InputError(f"damping time must be positive, got {self.damp}", "--damp")
        if not (math.isfinite(self.t_target) and math.isfinite(self.damp)):
            raise InputError(f"target temperature and damping time must be finite, got {self.t_target}, "
                             f"{self.damp}", "--t-target" if not math.isfinite(self.t_target) else "--damp")
        if not 0 <= int(self.seed) < 2 ** 64:
            raise InputError(f"seed must be in [0, 2**64), got {self.seed}", "--seed")

    @property
    def langevin(self):
        """True: the Langevin force is added after the pair forces."""
        return True
