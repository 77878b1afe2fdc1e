"""The user-facing simulation object: state + force field + integrator, run in chunks."""
import time

import numpy as np

from ..backend import resolve_device
from ..errors import InputError
from .forcefield import LennardJones
from .integrators import Langevin, VelocityVerlet
from .io import read_restart, write_restart
from .state import State
from .thermo import as_arrays, thermo_row

PRECISIONS = ("double", "mixed")
# GPU steps per kernel launch: a launch ends early at a list rebuild; beyond ~32 steps the launch
# cost is already small against the steps' own (H200, 4,000 particles: 12.9 us a step at 8, 12.2 at 32).
STEPS_PER_LAUNCH = 32
# Half the pair energy at r = sigma/2 (4 eps (2^12 - 2^6) / 2): any particle above it overlaps.
_OVERLAP_ENERGY = 2.0 * (4096.0 - 64.0)


class Simulation:
    """Molecular dynamics of one Lennard-Jones species in a periodic box.

    HOOMD-like composition: a :class:`State`, a :class:`LennardJones` force
    field and an integrator (:class:`VelocityVerlet` or :class:`Langevin`).
    On the GPU every timestep (integration, neighbour check, IF-node rebuild,
    forces) is captured once in a CUDA graph, and in ``while`` mode a whole
    chunk of steps (up to the next thermo or dump output) is one launch.

    Parameters
    ----------
    state : State
    forcefield : LennardJones
    integrator : VelocityVerlet or Langevin
    skin : float
        Verlet-list skin; the list is rebuilt once any particle has moved more
        than ``skin / 2`` since the last build.
    device : {"auto", "cpu", "gpu"}
    mode : {"auto", "eager", "graph", "while"}
        GPU driver (ignored on the CPU).
    precision : {"double", "mixed"}, optional
        ``mixed`` (float32 positions/velocities/forces, float64 energy and
        virial sums) is the GPU default; the CPU runs ``double`` only.
    unroll : int
        GPU steps per kernel launch, hence per graph launch (``graph``) or
        WHILE pass (``while``).
    neighbor_capacity : int, optional
        Initial neighbours per particle the GPU list holds; it grows by itself
        when a build overflows (the chunk is redone), so this only matters for tests.
    threads_per_particle : int, optional
        GPU lanes per particle in the force and list kernels (1, 2, ..., 32);
        chosen from N by default.
    cell_order : bool, optional
        GPU list and force kernels take particles in cell order (True) or index
        order (False); by default cell order from 20,000 particles. Results are
        the same either way; only speed differs.
    source : str, optional
        Where the state came from, for error messages.

    Attributes
    ----------
    thermo_log : list of dict
        Thermo rows (:data:`thermo.COLUMNS`) recorded by :meth:`run`.
    """

    def __init__(self, state, forcefield, integrator, *, skin=0.3, device="auto", mode="auto",
                 precision=None, unroll=STEPS_PER_LAUNCH, neighbor_capacity=None, threads_per_particle=None, cell_order=None,
                 source=None, _restart=None):
        if not isinstance(state, State):
            raise TypeError("state must be a solvers.md.State")
        forcefield.check_box(state.box, skin)
        self.device, self.device_note = resolve_device(device)
        if precision is None:
            precision = "mixed" if self.device == "gpu" else "double"
        if precision not in PRECISIONS:
            raise InputError(f"precision must be double or mixed, got {precision!r}", "--precision")
        if self.device == "cpu" and precision != "double":
            raise InputError("the CPU backend runs double precision only", "--precision")
        self.state, self.forcefield, self.integrator, self.skin = state, forcefield, integrator, float(skin)
        self.source = source
        if self.device == "gpu":
            from .gpu import GpuBackend
            self._backend = GpuBackend(state, forcefield, integrator, skin, mode=mode,
                                       precision=precision, unroll=unroll, restart=_restart,
                                       neighbor_capacity=neighbor_capacity, tpp=threads_per_particle,
                                       cell_order=cell_order)
        else:
            from .cpu import CpuBackend
            self._backend = CpuBackend(state, forcefield, integrator, skin, restart=_restart)
        self.mode, self.precision = self._backend.mode, precision
        self._check_overlaps()
        self.thermo_log = []
        self.thermo = thermo_row(state.step, state.n, state.volume, *self._backend.sums())

    def _check_overlaps(self):
        pe = self._backend.pe_atom
        worst = int(pe.argmax())
        e = float(pe[worst])
        if not e < _OVERLAP_ENERGY * self.forcefield.epsilon:
            raise InputError(f"particle {self.state.ids[worst]} overlaps a neighbour (pair energy {e:.3g} eps, "
                             f"closer than sigma/2): the run would blow up", self.source)

    # -- access ------------------------------------------------------------------
    @property
    def step(self):
        """Current timestep."""
        return self._backend.step

    @property
    def positions(self):
        """Wrapped positions, shape (N, 3) (CuPy on the GPU, NumPy on the CPU; a view)."""
        return self._backend.x[:, :3]

    @property
    def velocities(self):
        """Velocities, shape (N, 3) (a view)."""
        return self._backend.v[:, :3]

    @property
    def forces(self):
        """Forces at the current step, shape (N, 3) (a view)."""
        return self._backend.f[:, :3]

    @property
    def neighbor_builds(self):
        """Neighbour-list builds since setup (the setup build not counted, as in LAMMPS)."""
        return self._backend.builds

    def thermo_arrays(self):
        """The thermo log as one NumPy array per column."""
        return as_arrays(self.thermo_log)

    def get_state(self):
        """A host copy of the current state (float64)."""
        a = self._backend.arrays()
        s = self.state
        return State(np.asarray(a["positions"][:, :3], np.float64), np.asarray(a["velocities"][:, :3], np.float64),
                     s.box, ids=s.ids, mass=s.mass, images=a["images"][:, :3], step=self.step, origin=s.origin)

    # -- running -------------------------------------------------------------------
    def run(self, steps, *, thermo_every=0, dump=None, dump_every=0, on_thermo=None):
        """Advance ``steps`` timesteps.

        Parameters
        ----------
        steps : int
        thermo_every : int
            Record a thermo row every this many steps (0: only at the start and end).
        dump : DumpWriter, optional
            Written every ``dump_every`` steps (and at the start).
        dump_every : int
        on_thermo : callable, optional
            ``on_thermo(row)`` for each recorded row, as it is recorded.

        Returns
        -------
        float
            Wall time of the run in seconds (setup excluded).

        Raises
        ------
        UnstableRunError
            When the run blew up; the simulation is then unusable.
        """
        if steps < 0:
            raise InputError(f"steps must be >= 0, got {steps}", "--steps")
        start, end = self.step, self.step + int(steps)

        def record(row):
            self.thermo = row
            self.thermo_log.append(row)
            if on_thermo is not None:
                on_thermo(row)

        record(self.thermo)
        if dump is not None:
            dump.write(start, start * self.integrator.dt, self.get_state())
        t0 = time.perf_counter()
        while self.step < end:
            stops = [end]
            for every in (thermo_every, dump_every if dump is not None else 0):
                if every > 0:
                    stops.append((self.step // every + 1) * every)
            n = min(stops) - self.step
            sums = self._backend.advance(n)
            step = self.step
            row = thermo_row(step, self.state.n, self.state.volume, *sums)
            if step == end or (thermo_every and step % thermo_every == 0):
                record(row)
            else:
                self.thermo = row
            if dump is not None and dump_every and step % dump_every == 0:
                dump.write(step, step * self.integrator.dt, self.get_state())
        return time.perf_counter() - t0

    # -- restart -------------------------------------------------------------------
    def _meta(self):
        ff, it = self.forcefield, self.integrator
        meta = {"epsilon": ff.epsilon, "sigma": ff.sigma, "rc": ff.rc, "shift": ff.shift, "skin": self.skin,
                "dt": it.dt, "precision": self.precision, "builds": int(self._backend.builds),
                "thermostat": "langevin" if it.langevin else "none"}
        if it.langevin:
            meta.update(t_target=it.t_target, damp=it.damp, seed=int(it.seed))
        return meta

    def write_restart(self, path):
        """Save the state so that :meth:`from_restart` continues bit for bit."""
        s = self.get_state()
        write_restart(path, s, self._backend.arrays(), self._meta())

    @classmethod
    def from_restart(cls, path, *, device="auto", mode="auto", unroll=STEPS_PER_LAUNCH):
        """Continue a run saved by :meth:`write_restart` (same physics, precision and list)."""
        state, arrays, meta = read_restart(path)
        try:
            ff = LennardJones(meta["epsilon"], meta["sigma"], meta["rc"], meta["shift"])
            if meta["thermostat"] == "langevin":
                integ = Langevin(meta["dt"], meta["t_target"], meta["damp"], meta["seed"])
            else:
                integ = VelocityVerlet(meta["dt"])
            restart = dict(arrays, builds=meta["builds"])
            return cls(state, ff, integ, skin=meta["skin"], device=device, mode=mode,
                       precision=meta["precision"], unroll=unroll, source=path, _restart=restart)
        except KeyError as exc:
            raise InputError(f"restart lacks parameter {exc}", path) from None


