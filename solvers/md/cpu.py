"""CPU backend: NumPy (the reference the GPU kernels are tested against) or compiled (Numba) kernels."""
import numpy as np

from ..errors import InputError
from ..kernels import md_ref
from .neighbor_cpu import CandidatePairs, build_frame
from .thermo import UnstableRunError

# The CPU's modes: pair lists, forces and integration in whole-array NumPy passes, or in compiled loops.
CPU_MODES = ("numpy", "numba")


def cpu_mode(mode):
    """The CPU kernels ``mode`` names: ``numba`` or ``numpy``, and for any other (``auto``, or a GPU
    driver, which the CPU ignores) ``numba`` where it is installed, else ``numpy``.

    Raises :class:`InputError` for ``numba`` where Numba cannot be imported.
    """
    if mode == "numpy":
        return mode
    try:
        from . import numba_kernels  # noqa: F401
    except ImportError as exc:
        if mode == "numba":
            raise InputError(f"needs Numba (pip install numba, or the package's numba extra): {exc}",
                             "--mode") from None
        return "numpy"
    return "numba"


def pair_forces(mode):
    """The function ``(pairs, y, potential, n_out, energy) -> (f, pe_atom, vir_atom)`` of CPU ``mode``."""
    if mode == "numba":
        from .numba_kernels import pair_forces
        return pair_forces
    return lambda pairs, y, potential, n_out, energy: pairs.compute(y, potential, n_out, energy)


def kick_drift(x, v, f, img, hold, box, mass, dt):
    """The first half of a step in NumPy (see ``numba_kernels.kick_drift``)."""
    v = md_ref.half_kick(v, f, mass, dt)
    x, img, move_sq = md_ref.drift_wrap(x, v, img, box, dt)
    y, disp = build_frame(x, hold, box)
    return x, v, img, y, move_sq, np.einsum("ij,ij->i", disp, disp).max(initial=0.0)


def integration(mode):
    """The functions ``kick_drift`` (the first half of a step) and ``half_kick`` (the second) of CPU ``mode``."""
    if mode == "numba":
        from . import numba_kernels
        return numba_kernels.kick_drift, numba_kernels.half_kick
    return kick_drift, md_ref.half_kick


def langevin_force(integ, v, ids, step, mass):
    """The Langevin force of ``integ`` at ``step`` (zero without a thermostat)."""
    if not integ.langevin:
        return 0.0
    return md_ref.langevin_force(v, ids, step, mass, integ.t_target, integ.damp, integ.dt, integ.seed)


def unstable(step, ids, move_sq, max_move_sq):
    """The error for the lowest-id particle that moved more than allowed in one step, or None."""
    bad = ~(move_sq <= max_move_sq)
    if not bad.any():
        return None
    k = int(np.argmin(np.where(bad, ids, np.iinfo(np.int64).max)))
    return UnstableRunError(
        f"step {step}: particle {ids[k]} moved {np.sqrt(move_sq[k]):.3g} in one step "
        f"(more than half the neighbour cutoff, or not finite): the run blew up")


# Candidate pairs are searched for within rlist + CANDIDATE_SKINS * skin: they serve the list builds
# until some particle has moved that many half skins, about three builds (a tree query costs several
# times a cut by distance).
CANDIDATE_SKINS = 3.0


def candidate_radius(rlist, skin, box):
    """Radius of the candidate pairs: ``rlist`` plus ``CANDIDATE_SKINS`` skins, at most half the
    smallest box edge (where each pair has one nearest image), at least ``rlist``."""
    return max(rlist, min(rlist + CANDIDATE_SKINS * skin, 0.5 * float(min(box))))


class CpuBackend:
    """Velocity Verlet (plus Langevin) with a half Verlet list, float64.

    Parameters
    ----------
    state : State
    forcefield : LennardJones or Morse
    integrator : VelocityVerlet or Langevin
    skin : float
    mode : {"numpy", "numba"}
        Pair lists, forces and integration by NumPy (the list cut from k-d tree
        candidates, forces in blocks of whole-array passes) or by compiled loops (a
        cell list; one pass over the list; one over the particles for each half of
        a step). The same lists and the same integration; forces equal but for the
        order of the sums.
    restart : dict, optional
        ``forces``, ``hold`` (positions at the last list build) and ``builds``
        from a restart file: the list is rebuilt from ``hold`` and the saved
        forces are used, so the run continues bit for bit.
    """

    device = "cpu"
    precision = "double"
    ranks = 1

    def __init__(self, state, forcefield, integrator, skin, mode="numpy", restart=None):
        self.mode, self._pair_forces, self._integration = mode, pair_forces(mode), integration(mode)
        self.ff, self.integ = forcefield, integrator
        self.box, self.mass, self.ids = state.box.copy(), state.mass, state.ids
        self.n, self.volume = state.n, state.volume
        self.x, self.v, self.img = state.positions.copy(), state.velocities.copy(), state.images.copy()
        self.step = state.step
        self.rlist = forcefield.rc + skin
        self.candidate_radius = candidate_radius(self.rlist, skin, self.box)
        self.candidates = None
        self.trigger_sq = (0.5 * skin) ** 2
        self.max_move_sq = (0.5 * self.rlist) ** 2
        if restart is None:
            self.builds = 0  # the setup build is not counted, as in LAMMPS
            self._build(self.x)
        else:
            self.builds = int(restart["builds"])
            self._build(np.array(restart["hold"], np.float64))
        self._forces(build_frame(self.x, self.hold, self.box)[0], self.step, energy=True)
        if restart is not None:
            self.f = np.array(restart["forces"], np.float64)

    # -- pieces of a step ----------------------------------------------------
    def _build(self, at):
        self.hold = at.copy()
        if self.mode == "numba":
            from .numba_kernels import verlet_list
            self.pairs = verlet_list(at, self.box, self.rlist)
            return
        if self.candidates is None or not self.candidates.covers(at, self.rlist):
            self.candidates = CandidatePairs(at, self.box, self.candidate_radius)
        self.pairs = self.candidates.verlet(at, self.rlist)

    def _forces(self, y, step, energy):
        self.f, pe, vir = self._pair_forces(self.pairs, y, self.ff, self.n, energy)
        if energy:
            self.pe_atom, self.vir_atom = pe, vir
        self.f += langevin_force(self.integ, self.v, self.ids, step, self.mass)

    def _rebuild_now(self, step, move_sq, disp_sq_max):
        """True when the list must be rebuilt before this step's forces; raises when the run blew up.

        ``move_sq``: each particle's squared move this step; ``disp_sq_max``: the largest squared
        displacement since the last build.
        """
        error = unstable(step, self.ids, move_sq, self.max_move_sq)
        if error:
            raise error
        return disp_sq_max > self.trigger_sq

    def _rebuild(self):
        self._build(self.x)

    # -- driver ----------------------------------------------------------------
    def advance(self, nsteps):
        """Run ``nsteps`` timesteps; return the thermo sums at the last one."""
        dt = self.integ.dt
        kick_drift, half_kick = self._integration
        for k in range(nsteps):
            step = self.step + 1
            self.x, self.v, self.img, y, move_sq, disp_sq_max = kick_drift(self.x, self.v, self.f, self.img,
                                                                           self.hold, self.box, self.mass, dt)
            if self._rebuild_now(step, move_sq, disp_sq_max):
                self._rebuild()
                self.builds += 1
                y = self.x
            self._forces(y, step, energy=k == nsteps - 1)
            self.v = half_kick(self.v, self.f, self.mass, dt)
            self.step = step
        return self.sums()

    def sums(self):
        """``(sum m v^2, sum E_pair, sum r.F)`` at the current step."""
        return md_ref.thermo_sums(self.v, self.mass, self.pe_atom, self.vir_atom)

    def memory_bytes(self):
        """Bytes held in per-particle and per-pair arrays."""
        return (sum(a.nbytes for a in (self.x, self.v, self.f, self.img, self.hold)) + self.pairs.nbytes
                + (self.candidates.nbytes if self.candidates is not None else 0))

    def arrays(self):
        """Host copies of the per-particle arrays a restart needs."""
        return {"positions": self.x.copy(), "velocities": self.v.copy(), "images": self.img.copy(),
                "forces": self.f.copy(), "hold": self.hold.copy()}
