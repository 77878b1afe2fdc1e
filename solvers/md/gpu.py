"""CUDA backend: one timestep as a graph body, driven by :class:`solvers.engine.GraphEngine`.

The body is ``md_run``, a persistent kernel that takes up to ``unroll`` whole
steps (kick, drift, displacement check, forces, Langevin, second kick) with
grid barriers between the phases; the rebuild kernels inside ``loop.if_then``;
and ``md_force``, which finishes a step cut short by a rebuild. Large systems
leave ``md_run`` when a drift asks for a list rebuild; small ones run
``md_run_rebuilding``, which rebuilds in place, so the other two nodes then
have nothing to do. Whichever kernel reaches the chunk's
end stops it and reduces the thermo sums on the device. A chunk of steps
between outputs is one launch in ``while`` mode. Neighbour-list or cell
overflow is detected on the device: the host then enlarges the buffers,
restores the state saved at the chunk start, recaptures and redoes the chunk.
"""
import numpy as np

from ..kernels import cooperative, md_params, module
from ..backend import require_cupy
from ..engine import GraphEngine
from ..kernels.md_params import (C_BAD, C_BUILDS, C_CELLMAX, C_NBMAX, C_REBUILD, C_STATUS, C_STEP, C_TARGET, CTL_SIZE,
                                 ST_DONE, ST_OVERFLOW, ST_RUNNING, ST_UNSTABLE)
from .thermo import UnstableRunError

BLOCK = 128
RUN_BLOCK = 256  # md_run's threads per block (kernels/md.cu)
# Below this many particles a step is latency bound: more lanes per particle, and the list build's
# flat candidate walk (md_neigh_build_flat); above, 2 lanes and the nested walk (throughput bound).
# From H200 measurements (MEASUREMENTS.md): lanes 16 at 4,000 and 8 at 32,000 particles; the flat
# walk 13.5 against 14.8 us a step at 4,000 but 1,075 against 924 us at 1,048,576; cell order from
# _CELL_ORDER_MIN particles on.
_SMALL_SYSTEM_MAX = 100_000
_CELL_ORDER_MIN = 20_000
_KERNELS = ("md_cell_clear", "md_cell_bin", "md_cell_scan", "md_cell_sort", "md_neigh_build", "md_neigh_build_flat",
            "md_force")
SCAN_THREADS = 1024


def kernel_program(real, pair):
    """Arguments of :func:`solvers.kernels.program` for the MD kernels: ``real`` "double" or "float",
    ``pair`` the potential's functor (``PairLJ``, ``PairMorse``)."""
    return dict(name="md", real=real, defines=(("MD_BLOCK", str(BLOCK)), ("MD_PAIR", pair), *md_params.ctl_defines()),
                structs=md_params.all_structs(real, pair))


def threads_per_particle(n):
    """Lanes per particle in the force and list kernels: a power of 2 from 2 to 32.

    Small systems: about 16 (4,000 / n)^(1/3), so that 4,000 particles get 16 lanes and
    32,000 get 8; large systems: 2.
    """
    if n >= _SMALL_SYSTEM_MAX:
        return 2
    return int(min(32, max(2, 2 ** round(np.log2(16 * (4000 / max(n, 1)) ** (1 / 3))))))


def rebuilds_in_run(n, tpp, capacity):
    """True when ``md_run_rebuilding`` serves the system: it rebuilds lists in place.

    That takes all lane groups resident at once (``capacity`` blocks); larger
    systems leave ``md_run`` at a rebuild, whose fewer registers keep more
    threads resident (H200, 32,000 particles: 25,400 against 20,100 steps/s).
    """
    return n * tpp <= capacity * RUN_BLOCK


# Device buffers every MD backend holds under these names (MdParams' pointer fields of the same names).
_BUFFERS = ("hold", "pe", "vir", "partial", "thermo", "nlist", "ncount", "order", "ids", "ctl", "cell_count",
            "cell_atoms", "cell_sorted", "cell_pos", "cell_start")


def param_values(backend, *, pos, pos_alt, n_local, by_cell, count, skin, box, extent, planned=None, margin=0.0):
    """Every MdParams field (kernels/md_params.py) for a backend's buffers and settings.

    ``pos`` and ``pos_alt`` are the position buffers (the second receives a sorted copy),
    ``n_local`` the particles with ghosts, ``count`` the steps a launch, ``box`` the edges
    the kernels wrap by and ``extent`` the span the cells cover (the box, on one GPU);
    distributed runs: ``planned``, the own particles' positions when the ghosts were chosen,
    and ``margin``, how far they may move from there.
    """
    it, mass = backend.integ, backend.mass
    if it.langevin:
        seed = int(it.seed)
        bath = {"on": 1, "gamma_m": mass / it.damp, "noise": np.sqrt(24.0 * it.t_target * mass / (it.damp * it.dt)),
                "seed_lo": seed & 0xFFFFFFFF, "seed_hi": seed >> 32}
    else:
        bath = {"on": 0, "gamma_m": 0.0, "noise": 0.0, "seed_lo": 0, "seed_hi": 0}
    buffers = {name: getattr(backend, name).data.ptr for name in _BUFFERS}
    buffers.update(pos=pos.data.ptr, pos_alt=pos_alt.data.ptr, vel=backend.v.data.ptr, frc=backend.f.data.ptr,
                   img=backend.img.data.ptr)
    ncell, rlist = backend.ncell, backend.rlist
    return {**buffers, "n": backend.n, "n_local": n_local, "tpp": backend.tpp, "by_cell": int(by_cell),
            "ncells": backend.cell_count.size, "maxnb": backend.maxnb, "count": count, "dt": it.dt,
            "half_dt_m": 0.5 * it.dt / mass, "trigger_sq": (0.5 * skin) ** 2, "max_move_sq": (0.5 * rlist) ** 2,
            "rlist_sq": rlist ** 2, "mass": mass, "box": dict(zip(("lx", "ly", "lz"), box)),
            "cells": {"nx": ncell[0], "ny": ncell[1], "nz": ncell[2], "cap": backend.cellcap,
                      "sx": ncell[0] / extent[0], "sy": ncell[1] / extent[1], "sz": ncell[2] / extent[2]},
            "bath": bath, "pair": backend.ff.device_params(),
            "planned": 0 if planned is None else planned.data.ptr, "margin_sq": margin ** 2}


class DeviceAccess:
    """What a simulation reads from a GPU backend, on one GPU or on GPU ranks."""

    def sums(self):
        """``(sum m v^2, sum E_pair, sum r.F)`` at the current step (over all ranks, on ranks)."""
        return self._sums

    @property
    def pe_atom(self):
        """Per-particle pair energy of this process's particles (CuPy)."""
        return self.pe

    @property
    def builds(self):
        """Neighbour-list builds since setup."""
        with self.stream:
            return int(self.ctl[C_BUILDS].get())

    def memory_bytes(self):
        """Bytes of the device arrays this process holds."""
        return sum(a.nbytes for a in vars(self).values() if isinstance(a, self._cp.ndarray))

    def _allocate_cells_and_list(self, rows):
        """Cell and neighbour-list buffers for up to ``rows`` particles of this process."""
        cp = self._cp
        ncells = int(np.prod(self.ncell))
        self.cell_count = cp.zeros(ncells, np.int32)
        self.cell_atoms = cp.zeros(ncells * self.cellcap, np.int32)
        self.cell_sorted = cp.zeros(ncells * self.cellcap, np.int32)
        self.cell_pos = cp.zeros((ncells * self.cellcap, 4), self.real)
        self.cell_start = cp.zeros(ncells, np.int32)
        self.order = cp.arange(rows, dtype=np.int32)
        self.nlist = cp.zeros(md_params.neighbour_list_entries(self.maxnb, rows, self.tpp), np.int32)
        self.ncount = cp.zeros(rows, np.int32)


class GpuBackend(DeviceAccess):
    """Lennard-Jones MD on one GPU, in ``double`` or ``mixed`` precision.

    Parameters
    ----------
    state, forcefield, integrator, skin
        As for :class:`solvers.md.Simulation`.
    mode : {"auto", "eager", "graph", "while"}
    precision : {"double", "mixed"}
    unroll : int
        Steps per launch of ``md_run``, hence per graph launch (``graph``), per
        WHILE pass (``while``) and per host check (``eager``); fewer when a
        list rebuild cuts a launch short.
    restart : dict, optional
        Saved ``positions``, ``velocities``, ``images``, ``forces``, ``hold``,
        ``builds``: the list is rebuilt from ``hold`` and the forces restored.
    neighbor_capacity : int, optional
        Initial neighbours per particle the list holds (grown on overflow).
    tpp : int, optional
        Lanes per particle in the force and list kernels (default
        :func:`threads_per_particle`); it fixes the summation order.

    Attributes
    ----------
    regrows : int
        Chunks redone after a list or cell overflow.
    """

    device = "gpu"

    def __init__(self, state, forcefield, integrator, skin, *, mode="auto", precision="mixed", unroll,
                 restart=None, neighbor_capacity=None, tpp=None, cell_order=None):
        cp = self._cp = require_cupy()
        self.real = np.float64 if precision == "double" else np.float32
        self._real_c, self._pair = ("double" if precision == "double" else "float"), forcefield.functor
        mod = module(**kernel_program(self._real_c, self._pair))
        self._k = {name: mod.get_function(name) for name in _KERNELS}
        # md_run takes `unroll` steps a launch: the engine launches the body once a pass.
        self.unroll = int(unroll)
        self.engine = GraphEngine(self._launch_step, mode, 1)
        self.mode, self.stream = self.engine.mode, self.engine.stream
        self.ff, self.integ, self.mass, self.n = forcefield, integrator, state.mass, state.n
        self._params = None  # the packed MdParams; rebuilt when buffers move
        self.step, self.regrows = state.step, 0
        self.rlist = forcefield.rc + skin
        box = state.box
        self.ncell = np.maximum((box // self.rlist).astype(np.int64), 1)
        self.tpp = int(tpp or threads_per_particle(self.n))
        if self.tpp not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"tpp must be a power of 2 from 1 to 32, got {tpp}")
        rebuilding = cooperative(mod.get_function("md_run_rebuilding"), RUN_BLOCK)
        if rebuilds_in_run(self.n, self.tpp, rebuilding[1]):
            self._run, run_capacity = rebuilding
        else:
            self._run, run_capacity = cooperative(mod.get_function("md_run"), RUN_BLOCK)
        self._grid = (self.n + BLOCK - 1) // BLOCK
        self._grid_tpp = (self.n * self.tpp + BLOCK - 1) // BLOCK
        self._grid_run = min(-(-self.n * self.tpp // RUN_BLOCK), run_capacity)  # all resident: grid barriers
        # Lane groups of the list and force kernels take particles in cell order (neighbouring
        # groups share neighbours) or in index order; the results are the same.
        # Fixed here: the list built at setup is laid out in this order.
        self.build_by_cell = self.n >= _CELL_ORDER_MIN if cell_order is None else bool(cell_order)
        self._set_scalars(state.box, skin, forcefield, integrator)
        density = self.n / state.volume
        self.maxnb = int(neighbor_capacity or 1.3 * density * 4.0 / 3.0 * np.pi * self.rlist ** 3 + 16)
        self.cellcap = int(1.5 * density * np.prod(box / self.ncell) + 8)
        src = restart if restart is not None else {
            "positions": state.positions, "velocities": state.velocities, "images": state.images}
        with self.stream:
            self.x = self._vec4(src["positions"], self.real)
            self.x_alt = self._cp.empty_like(self.x)  # md_run's second position buffer
            self.v = self._vec4(src["velocities"], self.real)
            self.img = self._vec4(src["images"], np.int32)
            self.f = cp.zeros((self.n, 4), self.real)
            self.hold = self.x.copy() if restart is None else self._vec4(restart["hold"], self.real)
            self.pe = cp.zeros(self.n, np.float64)
            self.vir = cp.zeros(self.n, np.float64)
            self.ids = cp.asarray(state.ids, dtype=np.int64)
            self.thermo = cp.zeros(4, np.float64)
            self.partial = cp.zeros(3 * self._grid_tpp, np.float64)
            ctl = np.zeros(CTL_SIZE, np.uint64)
            ctl[C_STEP] = self.step
            ctl[C_BUILDS] = 0 if restart is None else int(restart["builds"])
            self.ctl = cp.asarray(ctl)
            self._allocate_lists()
            self._build_from(self.hold, copy=False)
            self._launch_force(0, setup=True)
            self._sums = tuple(float(t) for t in self.thermo.get()[:3])
            if restart is not None:
                self.f[:, :3] = cp.asarray(restart["forces"][:, :3], dtype=self.real)

    # -- setup helpers ---------------------------------------------------------------
    def _vec4(self, a, dtype):
        out = np.zeros((self.n, 4), dtype)
        out[:, :3] = np.asarray(a)[:, :3]
        return self._cp.asarray(out)

    def _set_scalars(self, box, skin, ff, it):
        self._box, self._skin = np.asarray(box, np.float64), float(skin)

    def _param_values(self):
        return param_values(self, pos=self.x, pos_alt=self.x_alt, n_local=self.n, by_cell=self.build_by_cell,
                            count=self.unroll, skin=self._skin, box=self._box, extent=self._box)

    @property
    def params(self):
        """The packed MdParams every kernel takes (by value)."""
        if self._params is None:
            self._params = md_params.pack(self._real_c, self._pair, self._param_values())
        return self._params

    def _allocate_lists(self):
        self._allocate_cells_and_list(self.n)
        self._params = None

    def _grow(self, ctl):
        """Enlarge what overflowed (the device recorded how much was needed)."""
        if ctl[C_CELLMAX]:
            self.cellcap = int(ctl[C_CELLMAX] * 1.25) + 4
        if ctl[C_NBMAX]:
            self.maxnb = int(ctl[C_NBMAX] * 1.2) + 8
        self._allocate_lists()
        self.engine.invalidate()
        self.regrows += 1

    # -- kernel launches ------------------------------------------------------------
    def _launch_rebuild(self, src, copy):
        k, p = self._k, self.params
        ncells = self.cell_count.size
        k["md_cell_clear"](((ncells + 255) // 256,), (256,), (p,))
        k["md_cell_bin"]((self._grid,), (BLOCK,), (p, src, np.int32(copy)))
        if self.build_by_cell:
            k["md_cell_scan"]((1,), (SCAN_THREADS,), (p,))
        k["md_cell_sort"](((ncells * self.cellcap + BLOCK - 1) // BLOCK,), (BLOCK,), (p,))
        k["md_neigh_build_flat" if self.n < _SMALL_SYSTEM_MAX else "md_neigh_build"]((self._grid_tpp,), (BLOCK,), (p,))

    def _launch_force(self, while_handle, setup=False):
        self._k["md_force"]((self._grid_tpp,), (BLOCK,),
                            (self.params, np.int32(setup), np.uint64(while_handle), np.int32(0)))

    def _launch_step(self, stream, loop):
        self._run(self._grid_run, (self.params, loop.condition("rebuild"), loop.handle), stream=stream)
        with loop.if_then("rebuild", stream) as branch, branch:
            self._launch_rebuild(self.x, copy=True)
        with stream:
            self._launch_force(loop.handle)

    # -- host-side steps (outside any graph) --------------------------------------
    def _build_from(self, src, copy):
        """Build the list from ``src`` now, growing the buffers until it fits."""
        while True:
            self.ctl[C_REBUILD] = 1
            self.ctl[C_NBMAX] = 0
            self.ctl[C_CELLMAX] = 0
            self._launch_rebuild(src, copy)
            ctl = self.ctl.get()
            if not (ctl[C_NBMAX] or ctl[C_CELLMAX]):
                break
            self._grow(ctl)
        self.ctl[C_REBUILD] = 0

    def _done(self):
        with self.stream:
            return int(self.ctl[C_STATUS].get()) != ST_RUNNING

    def advance(self, nsteps):
        """Run ``nsteps`` timesteps; return the thermo sums at the last one."""
        if nsteps <= 0:
            return self._sums
        cp = self._cp
        # The caller may have changed arrays on its own stream: order that work first.
        self.stream.wait_event(cp.cuda.get_current_stream().record())
        with self.stream:
            saved = [a.copy() for a in (self.x, self.v, self.f, self.img, self.hold, self.ctl)]
            while True:
                self.ctl[C_TARGET] = self.step + nsteps
                self.ctl[C_STATUS] = ST_RUNNING
                self.engine.run(self._done, nsteps)  # each launch takes at least one step
                ctl = self.ctl.get()
                if ctl[C_STATUS] == ST_DONE:
                    break
                if ctl[C_STATUS] == ST_UNSTABLE:
                    pid = int(self.ids[self.n - int(ctl[C_BAD])].get())
                    raise UnstableRunError(
                        f"step {int(ctl[C_STEP])}: particle {pid} moved more than half the neighbour cutoff "
                        f"in one step (or is not finite): the run blew up")
                if ctl[C_STATUS] != ST_OVERFLOW:
                    raise RuntimeError(f"device loop ended in state {int(ctl[C_STATUS])} before step "
                                       f"{self.step + nsteps}")
                self._grow(ctl)
                for dst, src in zip((self.x, self.v, self.f, self.img, self.hold, self.ctl), saved):
                    dst[...] = src
                self._build_from(self.hold, copy=False)
            self.step += nsteps
            self._sums = tuple(float(t) for t in self.thermo.get()[:3])
        return self._sums

    # -- access ----------------------------------------------------------------------
    def arrays(self):
        """Host copies of the per-particle arrays a restart needs."""
        with self.stream:
            return {"positions": self.x[:, :3].get(), "velocities": self.v[:, :3].get(),
                    "images": self.img[:, :3].get().astype(np.int64), "forces": self.f[:, :3].get(),
                    "hold": self.hold[:, :3].get()}
