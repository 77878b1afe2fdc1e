"""The user-facing simulation object: state + force field + integrator, run in chunks."""
import time

import numpy as np

from ..backend import resolve_device
from ..errors import InputError
from .forcefield import from_meta
from .integrators import Langevin, VelocityVerlet
from .io import read_restart, write_restart
from .cpu import CPU_MODES, CpuBackend, candidate_radius, cpu_mode
from .memory import require_run
from .state import State
from .thermo import as_arrays, thermo_row

PRECISIONS = ("double", "mixed")
# GPU steps per kernel launch: a launch ends early at a list rebuild; beyond ~32 steps the launch
# cost is already small against the steps' own (H200, 4,000 particles: 12.9 us a step at 8, 12.2 at 32).
STEPS_PER_LAUNCH = 32
# Over GPU ranks, steps enqueued between two reads of the device status: a list build (every ~10 steps
# in a liquid) is seen at the next read, and the steps enqueued after it change nothing.
STEPS_PER_CHECK = 4


class Simulation:
    """Molecular dynamics of one Lennard-Jones species in a periodic box.

    HOOMD-like composition: a :class:`State`, a pair potential
    (:class:`LennardJones` or :class:`Morse`) and an integrator
    (:class:`VelocityVerlet` or :class:`Langevin`).
    On the GPU every timestep (integration, neighbour check, IF-node rebuild,
    forces) is captured once in a CUDA graph, and in ``while`` mode a whole
    chunk of steps (up to the next thermo or dump output) is one launch.

    Parameters
    ----------
    state : State
    forcefield : LennardJones or Morse
    integrator : VelocityVerlet or Langevin
    skin : float
        Verlet-list skin; the list is rebuilt once any particle has moved more
        than ``skin / 2`` since the last build.
    device : {"auto", "cpu", "gpu"}
    mode : {"auto", "eager", "graph", "while", "numpy", "numba"}
        GPU driver (``eager``, ``graph``, ``while``; ignored on the CPU), or CPU
        kernels: ``numpy`` (whole-array passes, the reference) or ``numba``
        (compiled loops, about three times faster; needs Numba). ``auto`` on the
        CPU: ``numba`` where Numba is installed, else ``numpy``.
    precision : {"double", "mixed"}, optional
        ``mixed`` (float32 positions/velocities/forces, float64 energy and
        virial sums) is the GPU default; the CPU runs ``double`` only.
    unroll : int, optional
        GPU steps per kernel launch, hence per graph launch (``graph``) or
        WHILE pass (``while``); 32 by default. Over GPU ranks: steps enqueued
        between two reads of the device status (4 by default).
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
    comm : mpi4py communicator, optional
        With more than one rank, one simulation spread over the ranks (spatial
        decomposition; every rank calls every method with the same arguments, and
        passes the whole ``state``). Positions, velocities and forces are then the
        rank's own atoms; :meth:`get_state` gathers all of them on rank 0.

    Attributes
    ----------
    thermo_log : list of dict
        Thermo rows (:data:`thermo.COLUMNS`) recorded by :meth:`run`.
    """

    def __init__(self, state, forcefield, integrator, *, skin=0.3, device="auto", mode="auto",
                 precision=None, unroll=None, neighbor_capacity=None, threads_per_particle=None, cell_order=None,
                 source=None, comm=None, _restart=None):
        if not isinstance(state, State):
            raise TypeError("state must be a solvers.md.State")
        self.comm = comm if comm is not None and comm.Get_size() > 1 else None
        self.state, self.forcefield, self.integrator, self.skin = state, forcefield, integrator, float(skin)
        self.source = source
        if self.comm is None:
            self._setup(device, mode, precision, unroll, neighbor_capacity, threads_per_particle, cell_order,
                        _restart)
        else:
            from ..distributed.comm import agree
            agree(self.comm, self._setup, device, mode, precision, unroll, neighbor_capacity,
                  threads_per_particle, cell_order, _restart)
        self.thermo_log = []
        self.thermo = thermo_row(state.step, state.n, state.volume, *self._backend.sums())

    def _setup(self, device, mode, precision, unroll, neighbor_capacity, tpp, cell_order, restart):
        state, forcefield, integrator, skin = self.state, self.forcefield, self.integrator, self.skin
        forcefield.check_box(state.box, skin)
        self.device, self.device_note = resolve_device(device)
        if self.comm is not None and self.comm.allreduce(self.device == "cpu") and self.device == "gpu":
            self.device, self.device_note = "cpu", "auto: some ranks have no GPU, running on the CPU"
        if precision is None:
            precision = "mixed" if self.device == "gpu" else "double"
        if precision not in PRECISIONS:
            raise InputError(f"precision must be double or mixed, got {precision!r}", "--precision")
        if self.device == "cpu" and precision != "double":
            raise InputError("the CPU backend runs double precision only", "--precision")
        if self.device == "gpu" and mode in CPU_MODES:
            raise InputError(f"mode {mode} is a CPU mode; the GPU's are auto, eager, graph and while", "--mode")
        if self.device == "cpu":
            mode = cpu_mode(mode)
        if self.comm is None:
            wide = candidate_radius(forcefield.rc + skin, skin, state.box) if mode == "numpy" else None
            require_run(state.n, state.box, forcefield.rc + skin, self.device, self.source, candidates=wide)
        if self.comm is not None:
            from .parallel import distributed_backend
            self._backend = distributed_backend(self.device, self.comm, state, forcefield, integrator, skin,
                                                mode=mode, precision=precision, restart=restart, unroll=unroll)
        elif self.device == "gpu":
            from .gpu import GpuBackend
            self._backend = GpuBackend(state, forcefield, integrator, skin, mode=mode, precision=precision,
                                       unroll=STEPS_PER_LAUNCH if unroll is None else unroll, restart=restart,
                                       neighbor_capacity=neighbor_capacity, tpp=tpp, cell_order=cell_order)
        else:
            self._backend = CpuBackend(state, forcefield, integrator, skin, mode=mode, restart=restart)
        self.mode, self.precision = self._backend.mode, precision
        self._check_overlaps()

    def _check_overlaps(self):
        pe = self._backend.pe_atom
        if len(pe) == 0:
            return
        worst = int(pe.argmax())
        e = float(pe[worst])
        if not e < self.forcefield.overlap_energy():
            raise InputError(f"particle {int(self._backend.ids[worst])} overlaps a neighbour (pair energy "
                             f"{e:.3g}, closer than {self.forcefield.overlap_distance:.3g}): the run would blow up",
                             self.source)

    @property
    def ranks(self):
        """MPI ranks the simulation is spread over (1: a single process)."""
        return 1 if self.comm is None else self.comm.Get_size()

    @property
    def rank_grid(self):
        """Ranks along x, y, z of the spatial decomposition."""
        return getattr(self._backend, "grid", (1, 1, 1))

    def memory_mb(self):
        """Megabytes of per-particle arrays on each rank (a list, one entry per rank)."""
        mb = self._backend.memory_bytes() / 2 ** 20
        return [mb] if self.comm is None else self.comm.allgather(mb)

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

    @property
    def migrations(self):
        """Of this rank's list builds, those at which atoms moved between ranks (a distributed run; None
        for one process). The CPU ranks migrate at every build; the GPU ranks while no atom has moved
        more than a margin since the last migration keep their atoms and ghosts."""
        return getattr(self._backend, "migrations", None)

    def thermo_arrays(self):
        """The thermo log as one NumPy array per column."""
        return as_arrays(self.thermo_log)

    def get_state(self):
        """A host copy of the current state (float64); distributed: collective, on rank 0 (None elsewhere)."""
        a = self._backend.arrays()
        if a is None:
            return None
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
            Written every ``dump_every`` steps (and at the start). Distributed: on
            rank 0 only, with the same ``dump_every`` on every rank.
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
        if self.comm is not None:
            # A rank that stopped at another step would wait for the others forever.
            asked = self.comm.allgather((int(steps), int(thermo_every), int(dump_every)))
            if len(set(asked)) > 1:
                from .parallel import agreed
                raise agreed(InputError(f"the ranks asked for different runs (steps, thermo_every, dump_every): "
                                        f"{sorted(set(asked))}; every rank must make the same call", "run"))
        start, end = self.step, self.step + int(steps)

        def record(row):
            self.thermo = row
            self.thermo_log.append(row)
            if on_thermo is not None:
                on_thermo(row)

        # Distributed: frames are gathered on every rank (rank 0 holds the writer), so every rank
        # stops at the same steps.
        dumping = dump is not None or self.comm is not None

        def write_frame(step):
            if dumping and dump_every:
                state = self.get_state()
                if dump is not None:
                    dump.write(step, step * self.integrator.dt, state)

        record(self.thermo)
        write_frame(start)
        t0 = time.perf_counter()
        while self.step < end:
            stops = [end]
            for every in (thermo_every, dump_every if dumping else 0):
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
            if dump_every and step % dump_every == 0:
                write_frame(step)
        return time.perf_counter() - t0

    # -- restart -------------------------------------------------------------------
    def _meta(self):
        it = self.integrator
        meta = {**self.forcefield.meta(), "skin": self.skin, "dt": it.dt, "precision": self.precision,
                "builds": int(self._backend.builds), "thermostat": "langevin" if it.langevin else "none"}
        if it.langevin:
            meta.update(t_target=it.t_target, damp=it.damp, seed=int(it.seed))
        return meta

    def write_restart(self, path):
        """Save the state so that :meth:`from_restart` continues bit for bit (collective when distributed)."""
        arrays = self._backend.arrays()
        meta = self._meta()

        def write():
            if arrays is not None:
                s = self.state
                state = State(arrays["positions"], arrays["velocities"], s.box, ids=s.ids, mass=s.mass,
                              images=arrays["images"], step=self.step, origin=s.origin)
                write_restart(path, state, arrays, meta)

        if self.comm is None:
            write()
        else:
            from ..distributed.comm import agree
            agree(self.comm, write)

    @classmethod
    def from_restart(cls, path, *, device="auto", mode="auto", unroll=None, comm=None):
        """Continue a run saved by :meth:`write_restart` (same physics, precision and list).

        A restart written by any number of ranks continues on any number (``comm``).
        """
        state, arrays, meta = read_restart(path)
        try:
            ff = from_meta(meta, path)
            if meta["thermostat"] == "langevin":
                integ = Langevin(meta["dt"], meta["t_target"], meta["damp"], meta["seed"])
            else:
                integ = VelocityVerlet(meta["dt"])
            restart = dict(arrays, builds=meta["builds"])
            return cls(state, ff, integ, skin=meta["skin"], device=device, mode=mode,
                       precision=meta["precision"], unroll=unroll, source=path, comm=comm, _restart=restart)
        except KeyError as exc:
            raise InputError(f"restart lacks parameter {exc}", path) from None
