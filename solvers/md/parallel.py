"""One MD simulation over MPI ranks: spatial decomposition, ghosts, migration at list builds.

Each rank owns the atoms in its sub-box (:mod:`.domain`) and holds ghost
copies of its neighbours' atoms within the list cutoff (force cutoff plus
skin). Ghost forces are not sent back: a pair across a boundary is computed on
both ranks, each keeping the force on its own atom (half the messages of
Newton's third law across the boundary, and no second exchange a step). Every
step the ghosts' positions come from their owners; whether to rebuild the
lists is decided together (any rank's displacement check, reduced); at a
rebuild atoms first move to the rank that now owns them. Thermo sums are
reduced over the ranks. Dumps and restart files are gathered on rank 0 and
written by the single-process functions, in the order of the ids of the state
the run started from, so a restart written by N ranks resumes on any number.
"""
import sys

import numpy as np

from .. import interrupts
from ..distributed.comm import RankError, abort_on_error, world_or_report
from ..errors import DeviceError, InputError
from ..kernels import md_ref
from .cpu import CpuBackend, integration, langevin_force, pair_forces
from .domain import Domain, choose_grid
from .neighbor_cpu import PairList, build_frame, local_pairs
from .thermo import UnstableRunError

EXIT_BLOWUP, EXIT_BAD_INPUT = 1, 2
_NOBODY = np.iinfo(np.int64).min  # reduced flag: no particle moved too far


def distributed_backend(device, comm, state, forcefield, integrator, skin, *, mode, precision, restart, unroll):
    """This rank's backend of a distributed simulation on ``device`` (collective); ``mode``: the CPU's."""
    if device == "gpu":
        from .parallel_gpu import DistGpuBackend
        return DistGpuBackend(comm, state, forcefield, integrator, skin, precision=precision, restart=restart,
                              unroll=unroll)
    return DistCpuBackend(comm, state, forcefield, integrator, skin, mode=mode, restart=restart)


def agreed(error):
    """Mark an error every rank raises alike (abort_on_error lets it through)."""
    error.agreed = True
    return error


def gathered_arrays(comm, mine):
    """Every rank's restart arrays (host, with ``gidx``: their atoms' places in the starting state),
    put together in the starting state's order on rank 0; None on the other ranks."""
    parts = comm.gather(mine, root=0)
    if parts is None:
        return None
    gidx = np.concatenate([p["gidx"] for p in parts])
    out = {}
    for key in ("positions", "velocities", "images", "forces", "hold"):
        values = np.concatenate([p[key] for p in parts])
        out[key] = np.empty_like(values)
        out[key][gidx] = values
    return out


class GhostPlan:
    """Which of my atoms go to which rank as ghosts, and where theirs land in my arrays.

    Built at every list build from the build positions; used every step to send
    positions in the receivers' frames.

    Parameters
    ----------
    domain : Domain
    x : ndarray (n, 3)
        My atoms' build positions (all inside my sub-box).
    rlist : float
    comm : mpi4py communicator
    """

    def __init__(self, domain, x, rlist, comm):
        size = comm.Get_size()
        routes = domain.routes()
        index, route = domain.ghost_pairs(x, rlist)
        peers = np.array([peer for _, peer, _ in routes])
        shifts = np.array([shift for _, _, shift in routes])
        ends = np.cumsum(np.bincount(peers[route], minlength=size))  # pairs come grouped by peer
        self.send_index = np.split(index, ends[:-1])
        self.send_shift = np.split(shifts[route], ends[:-1])
        counts = comm.alltoall([len(i) for i in self.send_index])
        self.recv_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.comm, self.rank = comm, comm.Get_rank()

    @property
    def ghosts(self):
        """Number of ghost copies I hold."""
        return int(self.recv_offsets[-1])

    def exchange(self, y):
        """Ghost positions (in my frame) from my atoms' frame positions ``y`` on every rank."""
        out = np.empty((self.ghosts, 3))
        requests, keep = [], []
        for peer, (idx, shift) in enumerate(zip(self.send_index, self.send_shift)):
            lo, hi = self.recv_offsets[peer], self.recv_offsets[peer + 1]
            if peer == self.rank:
                out[lo:hi] = y[idx] + shift
                continue
            if hi > lo:
                requests.append(self.comm.Irecv(out[lo:hi], source=peer, tag=11))
            if idx.size:
                buf = y[idx] + shift
                keep.append(buf)
                requests.append(self.comm.Isend(buf, dest=peer, tag=11))
        from mpi4py import MPI
        MPI.Request.Waitall(requests)
        return out


class DistCpuBackend(CpuBackend):
    """One rank's part of a distributed simulation on the CPU (float64).

    Parameters are those of :class:`~solvers.md.cpu.CpuBackend` plus ``comm``;
    every rank passes the whole ``state`` (and ``restart``) and keeps its own atoms.
    It sets itself up on its own (its atoms, ghosts and lists are a rank's: k-d tree
    queries over them whatever the mode; ``mode`` chooses forces and integration) and takes
    the step loop from ``CpuBackend.advance``, with the rebuild decision made together.
    """

    device = "cpu"
    precision = "double"

    def __init__(self, comm, state, forcefield, integrator, skin, mode="numpy", restart=None):
        self.mode, self._pair_forces, self._integration = f"{mode} + MPI", pair_forces(mode), integration(mode)
        self.comm, self.ranks = comm, comm.Get_size()
        self.ff, self.integ = forcefield, integrator
        self.box, self.mass, self.n_total = state.box.copy(), state.mass, state.n
        self.state_ids = state.ids
        self.step = state.step
        self.rlist = forcefield.rc + skin
        self.trigger_sq = (0.5 * skin) ** 2
        self.max_move_sq = (0.5 * self.rlist) ** 2
        self.grid = choose_grid(self.box, self.ranks, self.rlist)
        self.domain = Domain(self.box, self.grid, comm.Get_rank())
        src = restart if restart is not None else {"positions": state.positions, "velocities": state.velocities,
                                                   "images": state.images}
        hold = np.asarray(restart["hold"], np.float64) if restart is not None else state.positions
        mine = np.flatnonzero(self.domain.owners(hold) == self.domain.rank)
        self.gidx = mine  # index of each of my atoms in the starting state (its place in gathered output)
        self.ids = state.ids[mine]
        self.x = np.array(src["positions"], np.float64)[mine]
        self.v = np.array(src["velocities"], np.float64)[mine]
        self.img = np.array(src["images"], np.int64)[mine]
        self.builds = 0 if restart is None else int(restart["builds"])
        self.migrations = 0  # list builds that moved atoms between ranks (all of them on the CPU)
        self._build(hold[mine])
        y = build_frame(self.x, self.hold, self.box)[0]
        self._forces(y, self.step, energy=True)
        if restart is not None:
            self.f = np.array(restart["forces"], np.float64)[mine]

    @property
    def n(self):
        """Atoms this rank owns."""
        return len(self.x)

    # -- lists, migration, ghosts ------------------------------------------------
    def _migrate(self):
        """Send each atom whose position left my sub-box to its new owner (at a list build)."""
        owner = self.domain.owners(self.x)
        fields = ("gidx", "ids", "x", "v", "img")
        outgoing = [None] * self.ranks
        for r in np.unique(owner[owner != self.domain.rank]):
            sel = owner == r
            outgoing[r] = {f: getattr(self, f)[sel] for f in fields}
        incoming = self.comm.alltoall(outgoing)
        keep = owner == self.domain.rank
        parts = [{f: getattr(self, f)[keep] for f in fields}] + [p for p in incoming if p is not None]
        merged = {f: np.concatenate([p[f] for p in parts]) for f in fields}
        order = np.argsort(merged["gidx"], kind="stable")  # the same order whatever the message order
        for f in fields:
            setattr(self, f, merged[f][order])

    def _build(self, at):
        self.hold = at.copy()
        self.plan = GhostPlan(self.domain, self.hold, self.rlist, self.comm)
        y = np.concatenate([self.hold, self.plan.exchange(self.hold)])
        i, j = local_pairs(y, self.n, self.rlist)
        self.pairs = PairList(i, j, len(y))

    def _forces(self, y, step, energy):
        y_all = np.concatenate([y, self.plan.exchange(y)])
        self.f, pe, vir = self._pair_forces(self.pairs, y_all, self.ff, self.n, energy)
        if energy:
            self.pe_atom, self.vir_atom = pe, vir
        self.f += langevin_force(self.integ, self.v, self.ids, step, self.mass)

    def _rebuild_now(self, step, move_sq, disp_sq_max):
        """The single-process decision taken together (collective): any rank's blow-up ends every
        rank with the same message, and any rank's displacement rebuilds every rank's list."""
        from mpi4py import MPI
        bad = ~(move_sq <= self.max_move_sq)
        flags = np.array([int(disp_sq_max > self.trigger_sq),
                          -int(self.ids[bad].min()) if bad.any() else _NOBODY], np.int64)
        self.comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
        if flags[1] != _NOBODY:  # the same message on every rank
            raise agreed(UnstableRunError(f"step {step}: particle {-flags[1]} moved more than half the "
                                          "neighbour cutoff in one step (or is not finite): the run blew up"))
        return bool(flags[0])

    def _rebuild(self):
        self.migrations += 1
        self._migrate()
        self._build(self.x)

    def sums(self):
        """``(sum m v^2, sum E_pair, sum r.F)`` over all ranks at the current step."""
        from mpi4py import MPI
        local = np.array(md_ref.thermo_sums(self.v, self.mass, self.pe_atom, self.vir_atom))
        self.comm.Allreduce(MPI.IN_PLACE, local, op=MPI.SUM)
        return tuple(float(s) for s in local)

    def memory_bytes(self):
        """Bytes held in per-particle and per-pair arrays on this rank."""
        return sum(a.nbytes for a in (self.x, self.v, self.f, self.img, self.hold)) + self.pairs.nbytes

    def arrays(self):
        """The restart arrays of all atoms, in the starting state's order, on rank 0 (None elsewhere)."""
        return gathered_arrays(self.comm, {"gidx": self.gidx, "positions": self.x, "velocities": self.v,
                                           "images": self.img, "forces": self.f, "hold": self.hold})


def run_distributed(args, run):
    """``python -m solvers.md`` on every rank of an MPI launch; returns this rank's exit code.

    ``run(args, comm)`` is the CLI's own run. Set-up errors are agreed by all
    ranks (exit code 2, rank 0 prints the message); a run that blew up is
    detected by all ranks together (exit code 1); anything else on one rank
    aborts the job.
    """
    comm = world_or_report()
    if comm is None:
        return EXIT_BAD_INPUT
    root = comm.Get_rank() == 0
    try:
        with abort_on_error(comm):
            interrupts.release()  # held since the start: from here a signal aborts the whole job
            interrupts.act_on_pending()
            return run(args, comm)
    except (InputError, DeviceError, RankError) as exc:
        if root:
            print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except UnstableRunError as exc:
        if root:
            print(f"error: run stopped: {exc}", file=sys.stderr)
        return EXIT_BLOWUP
