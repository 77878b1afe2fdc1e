"""NumPy backend: the reference the GPU kernels are tested against."""
import numpy as np

from ..kernels import md_ref
from .neighbor_cpu import build_pairs
from .thermo import UnstableRunError


class CpuBackend:
    """Velocity Verlet (plus Langevin) with a half Verlet list, float64.

    Parameters
    ----------
    state : State
    forcefield : LennardJones
    integrator : VelocityVerlet or Langevin
    skin : float
    restart : dict, optional
        ``forces``, ``hold`` (positions at the last list build) and ``builds``
        from a restart file: the list is rebuilt from ``hold`` and the saved
        forces are used, so the run continues bit for bit.
    """

    device = "cpu"
    mode = "numpy"
    precision = "double"

    def __init__(self, state, forcefield, integrator, skin, restart=None):
        self.ff, self.integ = forcefield, integrator
        self.box, self.mass, self.ids = state.box.copy(), state.mass, state.ids
        self.n, self.volume = state.n, state.volume
        self.x, self.v, self.img = state.positions.copy(), state.velocities.copy(), state.images.copy()
        self.step = state.step
        self.rlist = forcefield.rc + skin
        self.trigger_sq = (0.5 * skin) ** 2
        self.max_move_sq = (0.5 * self.rlist) ** 2
        if restart is None:
            self.builds = 0  # the setup build is not counted, as in LAMMPS
            self._build()
            self._compute_forces(self.step)
        else:
            self.hold = np.array(restart["hold"], np.float64)
            self.pi, self.pj = build_pairs(self.hold, self.box, self.rlist)
            self.builds = int(restart["builds"])
            self._compute_forces(self.step)
            self.f = np.array(restart["forces"], np.float64)

    # -- pieces of a step ----------------------------------------------------
    def _build(self):
        self.hold = self.x.copy()
        self.pi, self.pj = build_pairs(self.x, self.box, self.rlist)

    def _compute_forces(self, step):
        ff = self.ff
        d = md_ref.minimum_image(self.x[self.pj] - self.x[self.pi], self.box)
        rsq = np.einsum("ij,ij->i", d, d)
        inside = rsq < ff.rc * ff.rc
        i, j, d, rsq = self.pi[inside], self.pj[inside], d[inside], rsq[inside]
        fr, e, w = md_ref.lj_pair(rsq, ff.epsilon, ff.sigma, ff.energy_shift)
        fd = d * fr[:, None]
        f = np.empty((self.n, 3))
        for k in range(3):
            f[:, k] = np.bincount(j, fd[:, k], self.n) - np.bincount(i, fd[:, k], self.n)
        # Per-atom halves, as the GPU's full list accumulates them.
        self.pe_atom = 0.5 * (np.bincount(i, e, self.n) + np.bincount(j, e, self.n))
        self.vir_atom = 0.5 * (np.bincount(i, w, self.n) + np.bincount(j, w, self.n))
        if self.integ.langevin:
            it = self.integ
            f += md_ref.langevin_force(self.v, self.ids, step, self.mass, it.t_target, it.damp, it.dt, it.seed)
        self.f = f

    # -- driver ----------------------------------------------------------------
    def advance(self, nsteps):
        """Run ``nsteps`` timesteps; return the thermo sums at the last one."""
        dt = self.integ.dt
        for _ in range(nsteps):
            step = self.step + 1
            self.v = md_ref.half_kick(self.v, self.f, self.mass, dt)
            self.x, self.img, move_sq = md_ref.drift_wrap(self.x, self.v, self.img, self.box, dt)
            worst = int(np.argmax(move_sq))
            if not move_sq[worst] <= self.max_move_sq:
                raise UnstableRunError(
                    f"step {step}: particle {self.ids[worst]} moved {np.sqrt(move_sq[worst]):.3g} in one step "
                    f"(more than half the neighbour cutoff, or not finite): the run blew up")
            if md_ref.displacement_sq(self.x, self.hold, self.box).max() > self.trigger_sq:
                self._build()
                self.builds += 1
            self._compute_forces(step)
            self.v = md_ref.half_kick(self.v, self.f, self.mass, dt)
            self.step = step
        return self.sums()

    def sums(self):
        """``(sum m v^2, sum E_pair, sum r.F)`` at the current step."""
        return md_ref.thermo_sums(self.v, self.mass, self.pe_atom, self.vir_atom)

    def arrays(self):
        """Host copies of the per-particle arrays a restart needs."""
        return {"positions": self.x.copy(), "velocities": self.v.copy(), "images": self.img.copy(),
                "forces": self.f.copy(), "hold": self.hold.copy()}
