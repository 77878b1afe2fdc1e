"""One MD simulation over GPU ranks: the step as captured graphs, ghosts over NCCL between them.

The decomposition and ghost selection are those of the CPU path
(:mod:`.parallel`, :mod:`.domain`), done with array operations on the device at
list builds; migrating particles travel over NCCL too. A step is
an iteration of :class:`~solvers.engine.SegmentDriver`:

* graph ``md_kick_drift``, ``md_pack``: first kick and drift of the own
  particles, the displacement check (rebuild request) and the blow-up check,
  in ``ctl``; the send buffer, in each receiver's frame;
* the NCCL exchange of ghost positions straight into the tail of the position
  buffer, then an NCCL max-allreduce of the control flags, so every rank sees
  the same decision (the host's enqueueing bounds a small system's step: two
  graphs and two NCCL calls);
* graph ``md_build_gate``, list build, ``md_force``: an agreed list build on the
  particles and ghosts held, then forces and second kick; unless the reduced
  flags report a blow-up, or a list build with a particle past the ghost margin
  (below), or this rank's lists did not fit: then ``md_force`` records that in
  the status and the following steps change nothing.

Ghosts are chosen within the list cutoff plus twice a margin of the sub-box, so
a list build can keep the particles and ghosts a rank holds (on the device, no
message, the same graphs) while no particle has moved farther than the margin
since the ghosts were chosen. The host enqueues ``unroll`` steps, then reads the
status once; at a list build left to it, it wraps the own particles into the
box, migrates them, chooses the ghosts again, rebuilds the lists, recaptures the
graphs (sizes changed) and finishes the step. That is a few kernels (records,
route masks, a partition by key bits with a prefix sum, the list kernels) with
one synchronisation per partition, one MPI all-to-all of counts each for the
migration and the ghosts, and the check of the list's capacity. Lists that did
not fit on some rank send every rank back to its copy of the state at the
chunk's start (or at the last migration since), with larger lists there, to redo
the steps. A rank works in its own frame: coordinates
relative to its sub-box's corner less the ghost shell, without periodic images
(the kernels get a box so large that nothing wraps).
"""
import numpy as np

from ..backend import require_cupy
from ..distributed.comm import DeviceComm
from ..engine import Communicate, Segment, SegmentDriver, StatusCopies, held_weakly
from ..errors import DeviceError
from ..kernels import md_params, md_ref, module
from ..kernels.md_params import (C_BUILDS, C_CELLMAX, C_FAR, C_FORCED, C_NBMAX, C_REBUILD, C_REQ, C_STATUS, C_STEP,
                                 C_TARGET, CTL_SIZE, RANK_FRAME, ROUTES, ST_DONE, ST_OVERFLOW, ST_REBUILD, ST_RUNNING,
                                 ST_UNSTABLE)
from .domain import Domain, choose_grid
from .gpu import BLOCK, DeviceAccess, kernel_program, param_values, threads_per_particle
from .parallel import agreed, gathered_arrays
from .simulation import STEPS_PER_CHECK
from .thermo import UnstableRunError

# Box edge the kernels see inside a rank's frame: minimum images and wrapping never apply.
NO_PERIODS = 1e30
_KERNELS = ("md_cell_clear", "md_cell_bin", "md_cell_sort", "md_neigh_build", "md_force", "md_kick_drift",
            "md_pack", "md_records", "md_unpack", "md_ghost_routes", "md_bits_count", "md_bits_scatter",
            "md_build_gate")
# The ghost margin, in skins. Measured on two GPUs (MEASUREMENTS.md): 1 skin migrates at about 45% of
# the list builds, 3 skins at 12% (32,000 atoms) to 13% (1M), 4 skins at 7% and 8%, each faster at
# every size (32,000 atoms: 126.8 and 79.3 us a step for 1 and 3 skins in one run, 83.2 and 78.8 for 3
# and 4 in another).
MARGIN_SKINS = 4.0


def ghost_margin(width, rlist, skin):
    """How far particles may move between two migrations: MARGIN_SKINS skins, less where a sub-box is too
    thin for a ghost shell of ``rlist`` plus twice the margin (ghosts come from the neighbouring sub-boxes only).

    Between migrations an own particle and a ghost each move at most the margin, so a shell of
    ``rlist + 2 margin`` chosen at the migration still holds every particle within ``rlist`` of an own
    one at a later list build."""
    return max(0.0, min(MARGIN_SKINS * skin, 0.5 * (float(np.min(width)) - rlist)))


def _blocks(count):
    """Blocks of BLOCK threads for one thread per item (at least one block)."""
    return (max(1, -(-count // BLOCK)),)


class DistGpuBackend(DeviceAccess):
    """One rank's part of a distributed simulation on its GPU.

    Parameters are those of :class:`~solvers.md.gpu.GpuBackend` plus ``comm``;
    ``unroll`` is the number of steps enqueued between two reads of the status
    (None: :data:`STEPS_PER_CHECK`).
    Every rank passes the whole ``state`` (and ``restart``).
    """

    device = "gpu"
    mode = "graph segments + NCCL"

    def __init__(self, comm, state, forcefield, integrator, skin, *, precision, restart, unroll):
        from ..distributed.gpu import bind_device
        cp = self._cp = require_cupy()
        self.comm, self.ranks = comm, comm.Get_size()
        self.device_name = bind_device(comm)
        self.real = np.float64 if precision == "double" else np.float32
        self._real_c, self._pair = ("double" if precision == "double" else "float"), forcefield.functor
        mod = module(**kernel_program(self._real_c, self._pair))
        self._k = {name: mod.get_function(name) for name in _KERNELS}
        self.check_every = STEPS_PER_CHECK if unroll is None else int(unroll)
        self.ff, self.integ, self.mass = forcefield, integrator, state.mass
        self.box, self.n_total, self.step = np.asarray(state.box, np.float64), state.n, state.step
        self.skin, self.rlist = float(skin), forcefield.rc + skin
        self.grid = choose_grid(self.box, self.ranks, self.rlist)
        self.domain = Domain(self.box, self.grid, comm.Get_rank())
        self.margin = ghost_margin(self.domain.width, self.rlist, self.skin)
        self.reach = self.rlist + 2 * self.margin  # ghosts: within this of my sub-box when chosen
        self.migrations = 0  # list builds that moved particles between ranks and chose the ghosts again
        self.tpp = threads_per_particle(max(state.n // self.ranks, 1))
        # My frame: origin at my sub-box's corner less the ghost shell, its drift up to a migration and
        # half a skin more.
        self.shell = self.reach + self.margin + 0.5 * self.skin
        self.origin = self.domain.lo - self.shell
        extent = self.domain.width + 2 * self.shell
        self.ncell = np.maximum((extent // self.rlist).astype(np.int64), 1)
        self.extent = extent
        density = state.n / state.volume
        self.maxnb = int(1.3 * density * 4.0 / 3.0 * np.pi * self.rlist ** 3 + 16)
        self.cellcap = int(1.5 * density * np.prod(extent / self.ncell) + 8)
        self.regrows, self.capacity = 0, 0
        try:
            self.stream = cp.cuda.Stream(non_blocking=True)
            self.driver = SegmentDriver(self.stream, cp.cuda.Event)
            self.nccl = DeviceComm.shared(comm)
            self._set_routes()
            self._setup_atoms(state, restart)
            self._status = StatusCopies(self.ctl, self.stream)
        except cp.cuda.memory.OutOfMemoryError as exc:
            raise DeviceError(f"out of GPU memory while setting up the simulation ({exc})") from None

    # -- atoms, ghosts, lists --------------------------------------------------------
    def _setup_atoms(self, state, restart):
        cp = self._cp
        hold = np.asarray(restart["hold"] if restart is not None else state.positions, np.float64)
        mine = np.flatnonzero(self.domain.owners(hold) == self.domain.rank)
        src = restart if restart is not None else {"positions": state.positions, "velocities": state.velocities,
                                                   "images": state.images}
        x = np.asarray(src["positions"], np.float64)[mine]
        # Positions continued from the build positions (the frame of the saved list).
        x = hold[mine] + (x - hold[mine] - self.box * np.rint((x - hold[mine]) / self.box))
        with self.stream:
            self.gidx = cp.asarray(mine)
            self.ids = cp.asarray(state.ids[mine], dtype=np.int64)
            self.v = self._vec4(np.asarray(src["velocities"])[mine])
            self.img = self._vec4(np.asarray(src["images"])[mine], np.int32)
            ctl = np.zeros(CTL_SIZE, np.uint64)
            ctl[C_STEP] = ctl[C_FORCED] = self.step
            ctl[C_BUILDS] = 0 if restart is None else int(restart["builds"])
            self.ctl = cp.asarray(ctl)
            self.thermo = cp.zeros(4, np.float64)
            self._lay_out(self._vec4(x - self.origin), ctl, hold_from=self._vec4(hold[mine] - self.origin))
            self._launch_force(setup=True)
            self.ctl[C_REBUILD] = 0  # built for the current step: no build in the next one's graph
            self._sums = self._reduced_sums()
            if restart is not None:
                self.f[:, :3] = cp.asarray(np.asarray(restart["forces"])[mine], dtype=self.real)
        self.stream.synchronize()

    def _vec4(self, a, dtype=None):
        out = np.zeros((len(a), 4), dtype or self.real)
        out[:, :3] = np.asarray(a)[:, :3]
        return self._cp.asarray(out)

    def _lay_out(self, own, ctl, hold_from=None):
        """Ghost plan, positions (own, then ghosts), lists and graphs for the own positions ``own`` (my frame).

        ``ctl``: the control block to go on from (a host copy, uploaded with the list build).
        ``hold_from``: the build positions the list is made from (a restart's), else ``own``.
        Per-particle arrays are made afresh (from CuPy's pool); the lists keep their
        buffers while the particles fit (they are the large ones).
        """
        cp = self._cp
        n = len(own)
        build = own if hold_from is None else hold_from
        self._plan_ghosts(build)
        self.planned = build.copy()  # where the own particles were when the ghosts were chosen
        g = self.ghosts
        self.n, self.n_local = n, n + g
        self.frame = cp.empty((n + g, 4), self.real)
        self.frame[:n] = build
        self.hold = cp.empty_like(self.frame)
        self.f = cp.empty((n, 4), self.real)
        self.pe = cp.zeros(n, np.float64)
        self.vir = cp.zeros(n, np.float64)
        self.partial = cp.empty(3 * max(1, -(-n * self.tpp // BLOCK)), np.float64)
        self.sendbuf = cp.empty((max(len(self.send_index), 1), 4), self.real)
        self._ghost_transfers = self._transfers(self.sendbuf, self.send_counts, self.frame[n:], self.recv_counts)
        if n > self.capacity:
            self.capacity = int(1.1 * n) + 64
            self._allocate_lists()
        self.params = md_params.pack(self._real_c, self._pair, self._param_values())
        self._pack(self.stream)
        self._exchange(self.stream)
        self._build_lists(ctl)
        if hold_from is not None:
            self.frame[:n] = own
            self._pack(self.stream)
            self._exchange(self.stream)

    def _build_lists(self, ctl, from_hold=False):
        """The lists from the positions in ``frame`` (which become the build positions), or with
        ``from_hold`` from the build positions ``hold``, grown until they fit, and the step's graphs for
        them (captured while the list build runs).

        ``ctl`` (host copy) is uploaded with the build's flags set; md_force clears ``C_REBUILD`` at
        the end of the next step.
        """
        while True:
            ctl[C_REBUILD], ctl[C_NBMAX], ctl[C_CELLMAX] = 1, 0, 0
            self.ctl.set(ctl)
            self._launch_rebuild(self.stream, *((self.hold, 0) if from_hold else (self.frame, 1)))
            self._capture_step()
            built = self.ctl.get()
            if not (built[C_NBMAX] or built[C_CELLMAX]):
                break
            if built[C_CELLMAX]:
                self.cellcap = int(built[C_CELLMAX] * 1.25) + 4
            if built[C_NBMAX]:
                self.maxnb = int(built[C_NBMAX] * 1.2) + 8
            self.regrows += 1
            self._allocate_lists()
            self.params = md_params.pack(self._real_c, self._pair, self._param_values())

    def _plan_ghosts(self, own):
        """Which own particles (frame positions ``own``) go to which rank, grouped by rank, and how many
        ghosts come from each."""
        self.send_index, route, per_route = self._partition(self._route_masks(own), ROUTES)
        self.send_shift = self._route_shift[route]
        self.send_counts = self._per_peer(per_route)
        self.recv_counts = self._counts_from(self.send_counts)
        self.ghosts = int(self.recv_counts.sum())

    def _per_peer(self, per_route):
        """Counts per route (Domain.routes order) summed per receiving rank."""
        return np.bincount(self._route_peer, weights=per_route, minlength=self.ranks).astype(np.int64)

    def _counts_from(self, send):
        """What each rank sends me, from what I send each (one MPI all-to-all)."""
        recv = np.empty(self.ranks, np.int64)
        self.comm.Alltoall(np.ascontiguousarray(send, np.int64), recv)
        return recv

    def _set_routes(self):
        """Per route of ``Domain.routes``: its receiving rank and the shift from my frame to that rank's;
        and the ``RankFrame`` the list build's kernels take."""
        peers, shifts, offsets = [], [], []
        for offset, peer, periodic in self.domain.routes():
            s = np.zeros(4)
            # back to global, the periodic image, the peer's origin
            s[:3] = self.origin + periodic - (Domain(self.box, self.grid, peer).lo - self.shell)
            peers.append(peer)
            shifts.append(s)
            offsets.append((offset[0] + 1) * 9 + (offset[1] + 1) * 3 + (offset[2] + 1))
        self._route_peer = np.array(peers)
        self._route_shift = self._cp.asarray(np.array(shifts), dtype=self.real)
        dom = self.domain
        self._rank_frame = RANK_FRAME.pack(origin=self.origin, box=self.box, width=dom.width, lo=dom.lo, hi=dom.hi,
                                           reach=self.reach, grid=dom.grid, coords=dom.coords, offsets=offsets)

    def _allocate_lists(self):
        self._allocate_cells_and_list(self.capacity)

    def _param_values(self):
        return param_values(self, pos=self.frame, pos_alt=self.frame, n_local=self.n_local, by_cell=False, count=1,
                            skin=self.skin, box=(NO_PERIODS,) * 3, extent=self.extent, planned=self.planned,
                            margin=self.margin)

    # -- kernels and communication ----------------------------------------------------
    def _launch_rebuild(self, s, src, copy):
        """The list build's kernels (each returns at once unless ``ctl[C_REBUILD]`` is set) from the positions
        ``src``, which with ``copy`` become the build positions."""
        k, p = self._k, self.params
        ncells = self.cell_count.size
        k["md_cell_clear"](((ncells + 255) // 256,), (256,), (p,), stream=s)
        k["md_cell_bin"]((max(1, -(-self.n_local // BLOCK)),), (BLOCK,), (p, src, np.int32(copy)), stream=s)
        k["md_cell_sort"](((ncells * self.cellcap + BLOCK - 1) // BLOCK,), (BLOCK,), (p,), stream=s)
        k["md_neigh_build"]((max(1, -(-self.n * self.tpp // BLOCK)),), (BLOCK,), (p,), stream=s)

    def _launch_force(self, setup=False, stream=None):
        self._k["md_force"]((max(1, -(-self.n * self.tpp // BLOCK)),), (BLOCK,),
                            (self.params, np.int32(setup), np.uint64(0), np.int32(1)), stream=stream or self.stream)

    def _kick_drift(self, s):
        self._k["md_kick_drift"]((max(1, -(-self.n // BLOCK)),), (BLOCK,), (self.params,), stream=s)

    def _pack(self, s):
        count = len(self.send_index)
        if count:
            self._k["md_pack"]((-(-count // BLOCK),), (BLOCK,),
                               (self.params, self.send_index, self.send_shift, self.sendbuf, np.int32(count)),
                               stream=s)

    def _transfers(self, sendbuf, send_counts, recvbuf, recv_counts):
        """The NCCL calls that send rows of ``sendbuf`` (grouped by rank, ``send_counts`` each) and
        receive rows into ``recvbuf`` (from each rank in turn, ``recv_counts``): for ``DeviceComm.exchange``."""
        nccl = self.nccl._nccl
        dtype = {8: nccl.NCCL_FLOAT64, 4: nccl.NCCL_FLOAT32}[sendbuf.itemsize]
        width = sendbuf.shape[1]
        row = width * sendbuf.itemsize
        sends, recvs = [], []
        sent = received = 0
        for peer in range(self.ranks):
            if send_counts[peer]:
                sends.append((sendbuf.data.ptr + sent * row, int(width * send_counts[peer]), dtype, peer))
                sent += int(send_counts[peer])
            if recv_counts[peer]:
                recvs.append((recvbuf.data.ptr + received * row, int(width * recv_counts[peer]), dtype, peer))
                received += int(recv_counts[peer])
        return sends, recvs

    def _exchange(self, s):
        """Ghost positions from their owners into the tail of the position buffer (one NCCL group)."""
        self.nccl.exchange(self._ghost_transfers, s)

    def _reduce_flags(self, s):
        """ctl[C_REQ .. C_FAR] := their maxima over the ranks (one decision everywhere)."""
        nccl = self.nccl._nccl
        ptr = self.ctl.data.ptr + 8 * C_REQ
        self.nccl.comm.allReduce(ptr, ptr, C_FAR - C_REQ + 1, nccl.NCCL_UINT64, nccl.NCCL_MAX, s.ptr)

    def _capture_step(self):
        cap = self.driver.capture
        self._force_graph = cap(lambda s: self._launch_force(stream=s))
        self.iteration = [Segment(cap(self._kick_drift_and_pack)), Communicate(held_weakly(self._exchange)),
                          Communicate(held_weakly(self._reduce_flags)), Segment(cap(self._build_and_force))]

    def _kick_drift_and_pack(self, s):
        self._kick_drift(s)
        self._pack(s)

    def _build_and_force(self, s):
        self._k["md_build_gate"]((1,), (1,), (self.params,), stream=s)
        self._launch_rebuild(s, self.frame, 1)
        self._launch_force(stream=s)

    # -- driver ----------------------------------------------------------------------
    def _rebuild(self, ctl):
        """The agreed list build the device left to the host, some particle having moved past the ghost
        margin, at the current step (``ctl``: the control block read then): wrap, migrate, lay out again,
        finish the step's forces."""
        ctl = ctl.copy()
        ctl[C_REQ], ctl[C_FAR], ctl[C_STATUS] = 0, 0, ST_RUNNING
        ctl[C_BUILDS] += 1
        self.migrations += 1
        self._lay_out(self._migrate(), ctl)
        self._force_graph.launch(self.stream)
        self._save()

    def _save(self):
        """A copy of the state to redo steps from after an overflow (the arrays' sizes hold until the next
        migration, which saves again)."""
        self._saved = [a.copy() for a in self._state()]

    def _state(self):
        return self.frame, self.v, self.f, self.img, self.hold, self.ctl

    def _redo(self):
        """Back to the saved state with this rank's lists grown where they did not fit (collective: every
        rank redoes the steps since), the lists built again from the saved build positions."""
        ctl = self.ctl.get()
        if ctl[C_CELLMAX]:
            self.cellcap = int(ctl[C_CELLMAX] * 1.25) + 4
        if ctl[C_NBMAX]:
            self.maxnb = int(ctl[C_NBMAX] * 1.2) + 8
        self.regrows += bool(ctl[C_CELLMAX] or ctl[C_NBMAX])
        for dst, src in zip(self._state(), self._saved):
            dst[...] = src
        self._allocate_lists()
        self.params = md_params.pack(self._real_c, self._pair, self._param_values())
        self._build_lists(self.ctl.get(), from_hold=True)
        self.ctl[C_REBUILD] = 0  # the saved step's forces are done

    def _migrate(self):
        """Wrap the own particles into the box and send those that left my sub-box to their owners.

        Each particle becomes a record with a migration key (``md_records``);
        the leavers' records go grouped by destination in one NCCL group, after
        an exchange of counts. Stayers keep their order; arrivals follow by source
        rank. Returns the new own positions (my frame); velocities, images,
        indices and ids are replaced.
        """
        cp = self._cp
        rec, keys = self._records()
        index, _, per_key = self._partition(keys, md_ref.MIGRATION_KEYS)
        if per_key[md_ref.LOST]:
            raise RuntimeError("a particle moved past the neighbouring sub-boxes between two list builds")
        kept = int(per_key[0])
        send = self._per_peer(per_key[1:1 + ROUTES])
        recv = self._counts_from(send)
        merged = cp.empty((kept + int(recv.sum()), md_ref.RECORD), np.float64)
        cp.take(rec, index[:kept], axis=0, out=merged[:kept])
        outgoing = cp.take(rec, index[kept:], axis=0)
        self.nccl.exchange(self._transfers(outgoing, send, merged[kept:], recv), self.stream)
        own, self.v, self.img, self.gidx, self.ids = self._unpack(merged)
        return own

    # The list build's kernels (kernels/md_ref states each in NumPy).
    def _records(self):
        """The own particles' migration records and keys (``md_records``)."""
        cp = self._cp
        rec, keys = cp.empty((self.n, md_ref.RECORD), np.float64), cp.empty(self.n, np.uint32)
        self._k["md_records"](_blocks(self.n), (BLOCK,), (self.params, self.gidx, self._rank_frame, rec, keys),
                              stream=self.stream)
        return rec, keys

    def _partition(self, mask, nkeys):
        """``(index, key, count per key)`` of the set bits of ``mask`` (``md_bits_count``, a prefix sum
        of the counts, ``md_bits_scatter``): by key, then index.

        Device arrays of int32 and a host array of counts (the one synchronisation).
        """
        cp, n, s = self._cp, len(mask), self.stream
        blocks = _blocks(n)
        counts = cp.empty(nkeys * blocks[0], np.int32)
        args = (mask, np.int32(n), np.int32(nkeys))
        self._k["md_bits_count"](blocks, (BLOCK,), (*args, counts), stream=s)
        through = cp.cumsum(counts, dtype=np.int32)  # key-major: items up to key k, block b
        per_key = np.diff(through[blocks[0] - 1::blocks[0]].get(), prepend=0).astype(np.int64)
        offsets = through - counts
        total = int(per_key.sum())
        index, key = cp.empty(total, np.int32), cp.empty(total, np.int32)
        self._k["md_bits_scatter"](blocks, (BLOCK,), (*args, offsets, index, key), stream=s)
        return index, key, per_key

    def _unpack(self, rec):
        """``(positions in my frame, velocities, images, indices, ids)`` of records (``md_unpack``)."""
        cp, m = self._cp, len(rec)
        out = (cp.empty((m, 4), self.real), cp.empty((m, 4), self.real), cp.empty((m, 4), np.int32),
               cp.empty(m, np.int64), cp.empty(m, np.int64))
        self._k["md_unpack"](_blocks(m), (BLOCK,), (rec, np.int32(m), self._rank_frame, *out), stream=self.stream)
        return out

    def _route_masks(self, own):
        """The ghost route masks of the frame positions ``own`` (``md_ghost_routes``)."""
        n = len(own)
        mask = self._cp.empty(n, np.uint32)
        self._k["md_ghost_routes"](_blocks(n), (BLOCK,), (own, np.int32(n), self._rank_frame, mask),
                                   stream=self.stream)
        return mask

    def _on_any_rank(self, flag):
        """Whether ``flag`` holds on some rank (collective)."""
        from mpi4py import MPI
        both = np.array([int(flag)], np.int32)
        self.comm.Allreduce(MPI.IN_PLACE, both, op=MPI.MAX)
        return bool(both[0])

    def _reduced_sums(self):
        return tuple(float(v) for v in self.comm.allreduce(self.thermo.get()[:3]))

    def advance(self, nsteps):
        """Run ``nsteps`` timesteps (collective); return the reduced thermo sums at the last one."""
        if nsteps <= 0:
            return self._sums
        target = self.step + nsteps
        with self.stream:
            self.ctl[C_TARGET] = target
            self.ctl[C_STATUS] = ST_RUNNING
            self._save()
            pending = self._enqueue_chunk()
            while True:
                # The next chunk goes in before this one's status is read, so the device has work while
                # the host waits, reads and agrees; past a stop its steps change nothing.
                ahead = self._enqueue_chunk()
                ctl = self._status.read(pending)  # decisions agree (reduced flags); the lists' fit may not
                status = int(ctl[C_STATUS])
                if self._on_any_rank(status == ST_OVERFLOW):
                    self._redo()
                elif status == ST_RUNNING:
                    pending = ahead
                    continue
                elif status == ST_DONE:
                    break
                elif status == ST_UNSTABLE:
                    raise agreed(UnstableRunError(
                        f"step {int(ctl[C_STEP])}: a particle moved more than half the neighbour cutoff in one "
                        "step (or is not finite): the run blew up"))
                elif status == ST_REBUILD:
                    self._rebuild(ctl)
                else:
                    raise RuntimeError(f"device loop ended in state {status} before step {target}")
                pending = self._enqueue_chunk()
            self.step = target
            self._sums = self._reduced_sums()
        return self._sums

    def _enqueue_chunk(self):
        """``check_every`` steps, then a copy of the control block; returns the copy's ticket."""
        for _ in range(self.check_every):
            self.driver.enqueue(self.iteration)
        return self._status.take()

    # -- access ----------------------------------------------------------------------
    @property
    def x(self):
        """The own particles' positions, in this rank's frame (offset from the box, not wrapped): a view."""
        return self.frame[:self.n]

    def arrays(self):
        """The restart arrays of all particles, in the starting state's order, on rank 0 (None elsewhere)."""
        with self.stream:
            x = self.frame[:self.n, :3].get().astype(np.float64) + self.origin
            wraps = np.floor(x / self.box)
            mine = {"gidx": self.gidx.get(), "positions": x - wraps * self.box,
                    "images": self.img[:, :3].get().astype(np.int64) + wraps.astype(np.int64),
                    "velocities": self.v[:, :3].get(), "forces": self.f[:, :3].get(),
                    "hold": self.hold[:self.n, :3].get().astype(np.float64) + self.origin}
        return gathered_arrays(self.comm, mine)
