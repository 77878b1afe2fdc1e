"""Distributed PCG on GPUs: captured graph segments for the local work, NCCL in between.

NCCL calls cannot live in a graph with a conditional node, so an iteration is
a short list of steps run by the engine's :class:`~solvers.engine.SegmentDriver`:
plain captured graphs (local kernels on fixed buffers), the halo exchange (a
graph packing the send buffer, then grouped NCCL send/recv, on a second stream
and communicator, so it runs while the main stream's update and allreduce do)
and the allreduces of the partial inner products (see ``_build_steps``). A rank
multiplies whole rows of its extended block (owned and halo columns), against
vectors that carry the halo's copy at their tail. The host enqueues
``check_every`` iterations, then reads the device status once: no host
synchronisation per iteration. Each rank's decide kernel works on the same
allreduced numbers, so all ranks stop at the same iteration and leave the host
loop together.

Kernels: ``kernels/dist.cu`` (products, updates, packing and the decisions
that take reduced values, built on ``kernels/pcg.cu``'s row products) and
``pcg.cu``'s ``matrix_residual``.
"""
import socket
import time

import numpy as np

from .. import kernels
from ..backend import require_cupy
from ..engine import Communicate, Join, Overlap, Segment, SegmentDriver
from ..errors import DeviceError, InputError
from ..formats import choose_format
from ..kernels.pcg_ref import RUNNING
from ..kernels.structs import STATE, Struct
from ..pcg.gpu import BLOCK, kernel_program
from ..pcg.result import Reason
from .comm import DeviceComm, HostComm, agree

KERNELS = ("dist_spmv_dot", "dist_pack_next_z", "dist_update", "dist_start", "dist_decide", "dist_finish",
           "dist_cg1_step", "dist_cg1_decide", "dist_pack", "matrix_residual")
# SMs the classic update leaves to the pack and NCCL's halo kernel, which run alongside it (NCCL's
# send and receive take a block per channel, a few): filling them would hold the exchange back.
COMM_SMS = 4


def dist_struct(matrix):
    """``DistRun``, the argument struct of every kernel in ``kernels/dist.cu``, over a format's ``Matrix``.

    Vectors read at neighbouring rows have n + h entries, the halo's copy at the tail.
    Classic: z, q = A p, the pairs (p0, p1) and (r0, r1); single-reduction: the pairs
    (r0, r1), (s0, s1) with s = A p, (w0, w1) with w = A u, and w_halo the neighbours'
    new w. ``sums`` holds this rank's partial inner products, ``reduced`` their sums
    over ranks.
    """
    vectors = ("x", "z", "q", "p0", "p1", "p", "r0", "r1", "s0", "s1", "w0", "w1", "w_halo", "sendbuf")
    return Struct("DistRun", [("A", matrix), ("dinv", "const real_t*")] + [(v, "real_t*") for v in vectors] + [
        ("send_index", "const int*"), ("st", "State*"), ("reduced", "const double*"), ("pending", "int*"),
        ("history", "double*"), ("partials", "double*"), ("sums", "double*"), ("nsend", "int"), ("h", "int")])


def bind_device(comm):
    """Select this rank's GPU (its rank among the ranks of its host) and return its name.

    Raises DeviceError when a host runs more ranks than it has GPUs, or when two
    ranks end up on the same GPU (e.g. both see only one GPU through
    ``CUDA_VISIBLE_DEVICES``). Collective.
    """
    from mpi4py import MPI
    cupy = require_cupy()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank, local_size = node.Get_rank(), node.Get_size()
    node.Free()

    def select():
        count = cupy.cuda.runtime.getDeviceCount()
        if count < local_size and count != 1:
            raise DeviceError(f"{local_size} ranks on host {socket.gethostname()} but only {count} GPUs: "
                              "run one rank per GPU")
        device = cupy.cuda.Device(local_rank if count >= local_size else 0)
        device.use()
        return socket.gethostname(), device.pci_bus_id

    owners = comm.allgather(agree(comm, select))

    def check_one_rank_per_gpu():
        clash = [(owners.index(w), r) for r, w in enumerate(owners) if owners.index(w) != r]
        if clash:
            a, b = clash[0]
            raise DeviceError(f"ranks {a} and {b} share the GPU {owners[b][1]} on host {owners[b][0]}: "
                              "run one rank per GPU (one GPU visible per rank, or all GPUs visible to all ranks)")

    agree(comm, check_one_rank_per_gpu)  # every rank sees the same owners: an agreed set-up error
    return kernels.device_name()


class DistGPUPCG:
    """One rank's PCG on its GPU (see :class:`~solvers.distributed.solver.DistributedPCG`).

    Parameters
    ----------
    matrix : LocalMatrix
    inverse_diagonal : ndarray or None
        Of the owned rows.
    comm : mpi4py communicator
    variant : {"classic", "single-reduction"}
    dtype : dtype
    check_every : int
        Iterations enqueued between two reads of the device status.
    """

    device = "gpu"
    mode = "graph segments + NCCL"
    loop_time = 0.0  # seconds of the last solve's iterations (first launch to last status read)
    # ms of the last timed iteration that ran in full, step by step: compute, communication, ...
    step_times = ()

    def __init__(self, matrix, inverse_diagonal, comm, variant, dtype, check_every):
        self.cupy = self._backend()
        self.comm = comm
        self.matrix = matrix
        self.variant = variant
        self.dtype = np.dtype(dtype)
        self.check_every = int(check_every)
        self.communication_time = 0.0
        self.device_name = self._bind(comm)
        if inverse_diagonal is not None:  # the halo's entries too: the products precondition there
            halo = np.empty(matrix.plan.halo_size, dtype=inverse_diagonal.dtype)
            exchange = HostComm(comm, matrix.plan)
            exchange.start_halo(inverse_diagonal, halo)
            exchange.finish_halo()
            inverse_diagonal = np.concatenate([inverse_diagonal, halo])
        agree(comm, self._allocate, inverse_diagonal)
        # NCCL set-up is collective and cannot be agreed on: a failure here aborts the job.
        self.nccl = self._communicator(comm)
        self._graphs = None

    # The device layer, in methods a test can replace to run this driver's logic without a GPU.
    def _backend(self):
        return require_cupy()

    def _bind(self, comm):
        return bind_device(comm)

    def _communicator(self, comm):
        return DeviceComm.shared(comm)

    def _format(self, indptr, indices):
        return choose_format(indptr, indices, self.cupy)

    def _kernels(self, matrix_format):
        program = kernel_program(matrix_format, kernels.ctype(self.dtype), BLOCK, gather_stored=False)
        program["structs"] += (dist_struct(matrix_format.struct),)
        mod = kernels.module(**program, extra=("dist",))
        return {name: mod.get_function(name) for name in KERNELS}

    def _resident_blocks(self, kernel, spare_sms=0):
        return kernels.resident_blocks(kernel, BLOCK, spare_sms)

    def _streams(self):
        """(main, communication) streams; NCCL's halo kernel gets the higher priority, so it
        starts at once instead of queueing behind the product's blocks."""
        cuda = self.cupy.cuda
        # CUDA clamps a priority beyond the device's range to its greatest priority.
        return cuda.Stream(non_blocking=True), cuda.Stream(non_blocking=True, priority=-(2**30))

    # -- set-up ---------------------------------------------------------------
    def _allocate(self, inverse_diagonal):
        cupy, m = self.cupy, self.matrix
        if m.extended.nnz >= 2**31 - 1:
            raise InputError("more than 2^31 nonzeros on one rank: use more ranks (int32 indices)")
        try:
            self._allocate_buffers(inverse_diagonal)
        except cupy.cuda.memory.OutOfMemoryError as exc:
            raise DeviceError(f"out of GPU memory while setting up the solver ({exc})") from None

    def _allocate_buffers(self, inverse_diagonal):
        cupy, m, dt = self.cupy, self.matrix, self.dtype
        n, h = self.n, self.h = m.rows, m.plan.halo_size
        i32 = lambda a: cupy.asarray(np.ascontiguousarray(a, dtype=np.int32))  # noqa: E731
        self.format = self._format(i32(m.extended.indptr), i32(m.extended.indices))
        self.val = self.format.values(cupy.asarray(m.extended.data.astype(dt)))
        self.send_index, self.nsend = i32(m.plan.send_index), m.plan.send_size
        self.sendbuf = cupy.zeros(self.nsend, dtype=dt)

        self.k = self._kernels(self.format)
        product_threads = max(self.format.threads(), n)

        def grid(kernel, items, spare_sms=0):  # one wave of grid-stride blocks
            return int(max(1, min(-(-items // BLOCK), self._resident_blocks(self.k[kernel], spare_sms))))

        classic = self.variant == "classic"
        self.grid_spmv = grid("dist_spmv_dot" if classic else "dist_cg1_step", product_threads)
        self.grid_vec = grid("dist_update", n, COMM_SMS)
        self.grid_pack = grid("dist_pack", self.nsend)
        self.grid_residual = grid("matrix_residual", product_threads)

        zeros = lambda size=n: cupy.zeros(size, dtype=dt)  # noqa: E731
        # the vectors of dist_struct: a variant's own, the other's stay None
        self.x, self.b, self.scratch = zeros(), zeros(), zeros()
        self.x_ext = zeros(n + h)  # x with its halo, for residuals
        self.z = self.p0 = self.p1 = self.q = self.p = None
        self.s0 = self.s1 = self.w0 = self.w1 = self.w_halo = None
        if classic:
            self.z, self.p0, self.p1, self.q = zeros(n + h), zeros(n + h), zeros(n + h), zeros()
            self.r0, self.r1 = zeros(), zeros()
            self.r = self.r0
        else:
            self.r0, self.r1, self.s0, self.s1 = (zeros(n + h) for _ in range(4))
            self.w0, self.w1, self.w_halo, self.p = zeros(), zeros(), zeros(h), zeros()
            self.r = self.r0[:n]
        self.dinv = None if inverse_diagonal is None else cupy.asarray(inverse_diagonal.astype(dt))
        self.partials = cupy.zeros(3 * max(self.grid_spmv, self.grid_vec), dtype=cupy.float64)
        self.state = cupy.zeros(STATE.dtype.itemsize, dtype=cupy.uint8)
        self.sums = cupy.zeros(3, dtype=cupy.float64)     # this rank's partial inner products
        self.reduced = cupy.zeros(3, dtype=cupy.float64)  # their sums over ranks
        self.pending = cupy.zeros(1, dtype=cupy.int32)
        self.history = None
        self._struct = dist_struct(self.format.struct)
        self._pack_args()

        self.stream, self.comm_stream = self._streams()
        self.driver = SegmentDriver(self.stream, cupy.cuda.Event, self.comm_stream)
        # The uploads above ran on the legacy stream, which non-blocking streams do not wait for.
        cupy.cuda.Device().synchronize()

    # -- kernels ----------------------------------------------------------------
    def _fields(self):
        """The buffers and sizes of ``DistRun`` but its matrix, by field name (``st`` is the state)."""
        return {f: self.state if f == "st" else getattr(self, f) for f, _ in self._struct.fields if f != "A"}

    def _pack_args(self):
        """The kernels' argument struct (fixed addresses, captured into the step graphs)."""
        self._matrix_args = self.format.pack(self.val)
        self.args = self._struct.pack(A=self._matrix_args, **self._fields())

    def _launch(self, name, grid, s, *extra):
        self.k[name]((grid,), (BLOCK,), (self.args, *extra), stream=s)

    def _pack(self, s, v0, v1=None):
        """The send buffer from ``v0`` (or from the pair (v0, v1) that the last update wrote)."""
        self._launch("dist_pack", self.grid_pack, s, v0, v0 if v1 is None else v1)

    def _spmv_dot(self, s):
        self._launch("dist_spmv_dot", self.grid_spmv, s)

    def _classic_update(self, s, start):
        self._launch("dist_start" if start else "dist_update", self.grid_vec, s)

    def _pack_next_z(self, s):
        self._launch("dist_pack_next_z", self.grid_pack, s)

    def _finish(self):
        """Classic: the steps x += alpha p that no product took (see dist_update)."""
        if self.variant == "classic":
            self._launch("dist_finish", self.grid_vec, self.stream)

    def _cg1_step(self, s):
        self._launch("dist_cg1_step", self.grid_spmv, s)

    def _decide(self, s):
        name = "dist_decide" if self.variant == "classic" else "dist_cg1_decide"
        self.k[name]((1,), (32,), (self.args,), stream=s)

    # -- steps ------------------------------------------------------------------
    def _build_steps(self):
        """Capture the graph segments; return (start steps, iteration steps, decide graph).

        Classic: ``[product] allreduce(p.q)``, then ``[pack next z]`` and the halo of z (into
        z's tail) on the second stream while ``[update] allreduce(r.z, r.r)`` runs.
        Single-reduction: ``[step]``, then ``[pack w]`` and the halo of w (into w_halo) on the
        second stream while ``allreduce(r.r, r.u, w.u)`` runs. Each iteration's first graph
        waits for the exchange; its product kernel takes the decision pending from the last
        allreduce.
        """
        # the communication steps are kept, so they call the communicator, not self: a cycle through
        # them would keep this solver's device buffers until Python's cyclic collector ran
        cap, n, nccl = self.driver.capture, self.n, self.nccl

        def halo(transfers):
            return lambda s: nccl.exchange(transfers, s)

        def allreduce(send, recv, count):
            return Communicate(lambda s: nccl.allreduce(send, recv, count, s))

        decide = cap(self._decide)
        if self.variant == "classic":
            to_z = halo(self._transfers(self.z[n:]))
            reduce_rz = allreduce(self.sums[1:3], self.reduced[1:3], 2)
            start = [Segment(cap(lambda s: self._classic_update(s, True))),
                     Overlap(cap(lambda s: self._pack(s, self.z)), to_z), reduce_rz]
            iteration = [Join(), Segment(cap(self._spmv_dot)), allreduce(self.sums[0:1], self.reduced[0:1], 1),
                         Overlap(cap(self._pack_next_z), to_z),
                         Segment(cap(lambda s: self._classic_update(s, False))), reduce_rz]
            return start, iteration, decide
        iteration = [Join(), Segment(cap(self._cg1_step)),
                     Overlap(cap(lambda s: self._pack(s, self.w0, self.w1)), halo(self._transfers(self.w_halo))),
                     allreduce(self.sums, self.reduced, 3)]
        return [], iteration, decide

    def _transfers(self, halo):
        """The halo exchange from the send buffer into ``halo`` (the h received entries)."""
        return self.nccl.transfers(self.matrix.plan, self.sendbuf, halo)

    # -- solving ------------------------------------------------------------------
    def _fill_halo(self, v):
        """Entries [n, n + h) of ``v`` from their owners' [0, n) (outside the iteration)."""
        self._pack(self.stream, v)
        self.nccl.exchange(self._transfers(v[self.n:]), self.stream)

    def _residual(self, x, out):
        """out = b - A x over the owned rows."""
        self.x_ext[:self.n] = x
        self._fill_halo(self.x_ext)
        self.k["matrix_residual"]((self.grid_residual,), (BLOCK,), (self._matrix_args, self.x_ext, self.b, out),
                                  stream=self.stream)

    def _global_dot(self, u, v):
        with self.stream:
            local = float(self.cupy.dot(u, v))
        return self.comm.allreduce(local)

    def norm(self, v):
        with self.stream:  # a host v is copied on the stream that reads it
            v = self.cupy.asarray(v)
            return float(np.sqrt(self._global_dot(v, v)))

    def _reset(self, tol, maxiter):
        st = STATE.pack(tol=tol, maxiter=maxiter, status=RUNNING, iteration=-1)
        self.state.set(np.frombuffer(st.tobytes(), dtype=np.uint8), stream=self.stream)
        self.pending.fill(0)
        if self.variant == "classic":
            zeroed = (self.p0, self.p1)
        else:  # r0 holds r with its halo (set by solve); the set-up pass reads s0, w0, w_halo and p
            zeroed = (self.s0, self.w0, self.w_halo, self.p)
            self._fill_halo(self.r0)
        for v in zeroed:
            v.fill(0)

    def _ensure_history(self, maxiter, record_history):
        wanted = record_history and (self.history is None or self.history.size < maxiter + 1)
        if wanted:
            self.history = self.cupy.zeros(maxiter + 1, dtype=self.cupy.float64)
            self._pack_args()
            self._graphs = None  # the history pointer is baked into the graphs
        if self._graphs is None:
            with self.stream:
                self._graphs = self._build_steps()

    def _status(self):
        return STATE.read(self.state.get(stream=self.stream))

    def solve(self, b, x0, tol, maxiter, record_history):
        """Return ``(x, reason, iterations, rnorm, history)`` for the owned rows."""
        cupy = self.cupy
        if maxiter >= 2**31 - 1:
            raise InputError("maxiter must be below 2^31")
        self._ensure_history(maxiter, record_history)
        start, iteration, decide = self._graphs
        with self.stream:
            self.b.set(np.ascontiguousarray(b), stream=self.stream)
            x_is_zero = not self.comm.allreduce(x0 is not None and bool(np.any(x0)))
            if x_is_zero:
                self.x.fill(0)
                self.r[...] = self.b
            else:
                self.x.set(np.ascontiguousarray(x0), stream=self.stream)
                self._residual(self.x, self.r)
            self._reset(tol, maxiter)
        self.driver.enqueue(start)
        events = self.driver.timing_events(iteration)
        sampled_comm = sampled_total = 0.0
        t0 = time.perf_counter()
        launched = 0
        while True:
            # The device stops by itself at maxiter; this bound only guards the host loop.
            if launched > maxiter + self.check_every:
                raise RuntimeError("device loop did not stop at maxiter")
            for i in range(self.check_every):
                # Time one iteration per block, when the pipeline is full.
                used = self.driver.enqueue(iteration, events if i == self.check_every - 1 else None)
            launched += self.check_every
            decide.launch(self.stream)
            st = self._status()  # synchronises: one host read per check_every iterations
            ms = [cupy.cuda.get_elapsed_time(events[j], events[j + 1]) for j in range(used - 1)]
            sampled_total += sum(ms)
            sampled_comm += sum(ms[1::2])
            if int(st["status"]) != RUNNING:
                break
            self.step_times = ms  # a full iteration: the solve was still running after it
        # The last halo exchange may still run on the second stream; the send buffer and the
        # tails it fills are used again outside the iteration (_fill_halo), on this stream.
        self.driver.join()
        self._finish()
        self.loop_time = time.perf_counter() - t0
        if sampled_total > 0:
            self.communication_time += self.loop_time * sampled_comm / sampled_total
        reason = Reason(int(st["status"]))
        its = int(st["iteration"])
        history = self.history[: its + 1].get() if record_history else None
        with self.stream:  # after _finish, on its stream
            x = self.x.copy()
        return x, reason, its, float(st["rnorm"]), history

    def true_residual_norm(self, b, x):
        """``||b - A x||`` over all ranks, for the ``b`` of the last solve (already on the device)."""
        with self.stream:
            self._residual(x, self.scratch)
            return self.norm(self.scratch)
