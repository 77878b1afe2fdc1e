"""Distributed PCG on GPUs: captured graph segments for the local work, NCCL in between.

NCCL calls cannot live in a graph with a conditional node, so an iteration is
a short list of *steps*: plain captured graphs (local kernels on fixed
buffers), the halo exchange (grouped NCCL send/recv; for classic PCG on a second
stream, overlapping its r.z allreduce and the product with the owned columns;
for single-reduction in line, or optionally overlapping that product) and
allreduces of the partial inner products (see ``_build_steps``). The host enqueues ``check_every``
iterations, then reads the device status once: no host synchronisation per
iteration. Each
rank's decide kernel works on the same allreduced numbers, so all ranks stop
at the same iteration and leave the host loop together.

Kernels: ``kernels/pcg.cu`` (``pcg_spmv_dot`` for the local block,
``matrix_residual``) and ``kernels/dist.cu`` (packing, halo product, the
updates and decisions that take reduced values).
"""
import socket
import time

import numpy as np

import kernels
from kernels.pcg_ref import RUNNING

from ..backend import require_cupy
from ..errors import DeviceError, InputError
from ..pcg.gpu import BLOCK, STATE_DTYPE
from ..pcg.layout import MatrixLayout
from ..pcg.result import Reason
from .comm import DeviceComm, agree

# Step kinds of an iteration (see DistGPUPCG._run_steps).
GRAPH, HALO, HALO_START, HALO_WAIT, ALLREDUCE = range(5)
# With the overlapped exchange, the interior product runs in this many one-wave grids' worth of
# blocks, so NCCL's kernel finds a free slot as soon as the first small blocks finish instead of
# queueing behind a grid that holds every slot until the product ends.
PRODUCT_WAVES = 16
KERNELS = ("pcg_spmv_dot", "matrix_residual", "dist_pack", "dist_halo_direction", "dist_halo_spmv", "dist_update",
           "dist_start", "dist_decide", "dist_cg1_update", "dist_cg1_start", "dist_cg1_decide")


def _local_layout(M):
    """The owned block in the layout pcg.cu's products read: ``(rowptr, col, val, defines)``.

    The single-process solver's rule (:class:`~solvers.pcg.layout.MatrixLayout`),
    so both run the same product.
    """
    layout = MatrixLayout(M.indptr.astype(np.int32), M.indices.astype(np.int32), np)
    return layout.rowptr, layout.col, layout.values(M.data), layout.defines


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
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    return props["name"].decode()


class DistGPUPCG:
    """One rank's PCG on its GPU (see :class:`~solvers.dist.solver.DistributedPCG`).

    Parameters
    ----------
    matrix : LocalMatrix
    inverse_diagonal : ndarray or None
    comm : mpi4py communicator
    variant : {"classic", "single-reduction"}
    dtype : dtype
    check_every : int
        Iterations enqueued between two reads of the device status.
    overlap_halo : bool
        Single-reduction only: exchange the halo on a second stream while the
        interior product runs (the classic variant always does, and its
        exchange also overlaps its r.z allreduce).
    """

    device = "gpu"
    mode = "graph segments + NCCL"
    loop_time = 0.0  # seconds of the last solve's iterations (first launch to last status read)
    # ms of the last timed iteration that ran in full, step by step: compute, communication, ...
    step_times = ()

    def __init__(self, matrix, inverse_diagonal, comm, variant, dtype, check_every, overlap_halo=False):
        self.cupy = self._backend()
        self.comm = comm
        self.matrix = matrix
        self.variant = variant
        self.overlap = bool(overlap_halo) and variant == "single-reduction"
        self.dtype = np.dtype(dtype)
        self.check_every = int(check_every)
        self.communication_time = 0.0
        self.device_name = self._bind(comm)
        agree(comm, self._allocate, inverse_diagonal)
        # NCCL set-up is collective and cannot be agreed on: a failure here aborts the job.
        self.nccl = self._communicator(comm)
        self._transfers = self.nccl.transfers(matrix.plan, self.sendbuf, self.halo)
        self._graphs = None

    # The device layer, in methods a test can replace to run this driver's logic without a GPU.
    def _backend(self):
        return require_cupy()

    def _bind(self, comm):
        return bind_device(comm)

    def _communicator(self, comm):
        return DeviceComm(comm)

    def _kernels(self, defines):
        mod = kernels.module("pcg", kernels.ctype(self.dtype), defines, extra=("dist",))
        return {name: mod.get_function(name) for name in KERNELS}

    def _resident_blocks(self, kernel):
        return kernels.resident_blocks(kernel, BLOCK)

    def _streams(self):
        """(main, communication) streams; NCCL's kernels get the higher priority, so the
        halo exchange starts at once instead of queueing behind the interior product's blocks."""
        cuda = self.cupy.cuda
        # CUDA clamps a priority beyond the device's range to its greatest priority.
        return cuda.Stream(non_blocking=True), cuda.Stream(non_blocking=True, priority=-(2**30))

    # -- set-up ---------------------------------------------------------------
    def _allocate(self, inverse_diagonal):
        cupy, m = self.cupy, self.matrix
        if m.local.nnz >= 2**31 - 1:
            raise InputError("more than 2^31 nonzeros on one rank: use more ranks (int32 indices)")
        try:
            self._allocate_buffers(inverse_diagonal)
        except cupy.cuda.memory.OutOfMemoryError as exc:
            raise DeviceError(f"out of GPU memory while setting up the solver ({exc})") from None

    def _allocate_buffers(self, inverse_diagonal):
        cupy, m, dt = self.cupy, self.matrix, self.dtype
        n = self.n = m.rows
        i32 = lambda a: cupy.asarray(np.ascontiguousarray(a, dtype=np.int32))  # noqa: E731
        rowptr, col, val, defines = _local_layout(m.local)
        self.rowptr, self.col, self.val = i32(rowptr), i32(col), cupy.asarray(val.astype(dt))
        self.hptr, self.hcol = i32(m.halo.indptr), i32(m.halo.indices)
        self.hval = cupy.asarray(m.halo.data.astype(dt))
        self.brows, self.send_index = i32(m.boundary_rows), i32(m.plan.send_index)
        self.nb, self.nsend = int(m.boundary_rows.size), m.plan.send_size
        self.sendbuf = cupy.zeros(self.nsend, dtype=dt)
        self.halo = cupy.zeros(m.plan.halo_size, dtype=dt)
        # classic: the halo's copy of the direction p, updated from the received z (dist_halo_direction)
        self.halo_p = cupy.zeros(m.plan.halo_size, dtype=dt) if self.variant == "classic" else None

        self.k = self._kernels(defines)
        rows_per_block = BLOCK // int(dict(defines).get("SUBWARP", 1))

        def grid(kernel, items, per_block):  # one wave of grid-stride blocks
            return int(max(1, min(-(-items // per_block), self._resident_blocks(self.k[kernel]))))

        update = "dist_update" if self.variant == "classic" else "dist_cg1_update"
        waves = PRODUCT_WAVES if self.overlap else 1
        self.grid_spmv = min(-(-n // rows_per_block), waves * grid("pcg_spmv_dot", n, rows_per_block))
        self.grid_vec = grid(update, n, BLOCK)
        self.grid_halo, self.grid_pack = grid("dist_halo_spmv", self.nb, BLOCK), grid("dist_pack", self.nsend, BLOCK)
        self.grid_halo_p = grid("dist_halo_direction", m.plan.halo_size, BLOCK)

        zeros = lambda: cupy.zeros(n, dtype=dt)  # noqa: E731
        # classic: z, q = A p, p0/p1 the double-buffered direction; single-reduction: z holds
        # u = M^-1 r, q holds w = A u, p and s = A p, p0 stays zero and p1 receives a copy of u.
        self.x, self.b, self.r, self.z, self.q, self.p0, self.p1 = (zeros() for _ in range(7))
        self.p, self.s = (zeros(), zeros()) if self.variant == "single-reduction" else (None, None)
        self.scratch = zeros()  # true residual
        self.dinv = None if inverse_diagonal is None else cupy.asarray(inverse_diagonal.astype(dt))
        self.dinv_arg = self.dinv if self.dinv is not None else np.uint64(0)
        self.partials = cupy.zeros(2 * max(self.grid_spmv, self.grid_vec, self.grid_halo), dtype=cupy.float64)
        self.state = cupy.zeros(STATE_DTYPE.itemsize, dtype=cupy.uint8)
        self.shadow = cupy.zeros(STATE_DTYPE.itemsize, dtype=cupy.uint8)
        self.sums = cupy.zeros(3, dtype=cupy.float64)     # this rank's partial inner products
        self.reduced = cupy.zeros(3, dtype=cupy.float64)  # their sums over ranks
        self.pending = cupy.zeros(1, dtype=cupy.int32)
        self.history = None
        self.history_arg = np.uint64(0)

        self.stream, self.comm_stream = self._streams()
        self.ev_packed = cupy.cuda.Event(disable_timing=True)
        self.ev_halo = cupy.cuda.Event(disable_timing=True)
        # The uploads above ran on the legacy stream, which non-blocking streams do not wait for.
        cupy.cuda.Device().synchronize()

    # -- kernels ----------------------------------------------------------------
    def _pack(self, s, v):
        self.k["dist_pack"]((self.grid_pack,), (BLOCK,),
                            (v, self.send_index, self.sendbuf, self.state, self.shadow, np.int32(self.nsend)),
                            stream=s)

    def _halo_direction(self, s):
        self.k["dist_halo_direction"]((self.grid_halo_p,), (BLOCK,),
                                      (self.halo, self.halo_p, self.state, np.int32(self.halo.size)), stream=s)

    def _local_product(self, s, v):
        """q = A_local (v + beta p_old) with its dot into the shadow state (pcg.cu's kernel)."""
        self.k["pcg_spmv_dot"]((self.grid_spmv,), (BLOCK,),
                               (self.rowptr, self.col, self.val, v, self.p0, self.p1, self.q, self.shadow,
                                self.partials, np.int32(self.n)), stream=s)

    def _halo_product(self, s, h, y, sign, out):
        self.k["dist_halo_spmv"]((self.grid_halo,), (BLOCK,),
                                 (self.hptr, self.hcol, self.hval, self.brows, h, y,
                                  self.dtype.type(sign), self.p0, self.p1, self.state, self.shadow,
                                  self.partials, out, np.int32(self.nb)), stream=s)

    def _classic_update(self, s, start):
        self.k["dist_start" if start else "dist_update"](
            (self.grid_vec,), (BLOCK,),
            (self.x, self.r, self.q, self.p0, self.p1, self.dinv_arg, self.z, self.state, self.shadow,
             self.reduced, self.partials, self.sums[1:], self.pending, np.int32(self.n)), stream=s)

    def _cg1_update(self, s, start):
        self.k["dist_cg1_start" if start else "dist_cg1_update"](
            (self.grid_vec,), (BLOCK,),
            (self.x, self.r, self.z, self.q, self.p, self.s, self.dinv_arg, self.state, self.shadow,
             self.partials, self.sums, self.pending, np.int32(self.n)), stream=s)

    def _decide(self, s):
        if self.variant == "classic":  # also refreshes the shadow state for the product that follows
            self.k["dist_decide"]((1,), (32,), (self.state, self.shadow, self.reduced, self.pending,
                                                self.history_arg), stream=s)
        else:
            self.k["dist_cg1_decide"]((1,), (32,), (self.state, self.reduced, self.pending, self.history_arg),
                                      stream=s)

    # -- steps ------------------------------------------------------------------
    def _capture(self, launch):
        """A plain graph of the kernels ``launch(stream)`` enqueues."""
        s = self.stream
        s.begin_capture()
        try:
            launch(s)
        finally:
            graph = s.end_capture()
        return graph

    def _build_steps(self):
        """Capture the graph segments; return (start steps, iteration steps, decide graph).

        Classic: ``[update, pack z]``, then the halo of z on the second stream while
        ``allreduce(r.z, r.r) [decide, interior product]`` runs, then ``[halo direction,
        boundary product] allreduce(p.q)``.
        Single-reduction: ``[decide, update, pack u] halo of u [product] allreduce(r.r, r.u, w.u)``,
        the exchange in line or overlapping the interior product.
        """
        cap = self._capture
        decide = cap(self._decide)
        local = lambda s: self._local_product(s, self.z)  # noqa: E731
        if self.variant == "classic":
            reduce_rz = [(HALO_START,), (ALLREDUCE, self.sums[1:3], self.reduced[1:3], 2)]
            start = [(GRAPH, cap(lambda s: (self._classic_update(s, True), self._pack(s, self.z))))] + reduce_rz
            boundary = cap(lambda s: (self._halo_direction(s),
                                      self._halo_product(s, self.halo_p, self.q, 1, self.sums[0:])))
            update = cap(lambda s: (self._classic_update(s, False), self._pack(s, self.z)))
            iteration = [(GRAPH, cap(lambda s: (self._decide(s), local(s)))), (HALO_WAIT,), (GRAPH, boundary),
                         (ALLREDUCE, self.sums[0:1], self.reduced[0:1], 1), (GRAPH, update)] + reduce_rz
            return start, iteration, decide
        boundary = lambda s: self._halo_product(s, self.halo, self.q, 1, self.sums[2:])  # noqa: E731
        if self.overlap:
            product = [(HALO_START,), (GRAPH, cap(local)), (HALO_WAIT,), (GRAPH, cap(boundary))]
        else:
            product = [(HALO,), (GRAPH, cap(lambda s: (local(s), boundary(s))))]
        product.append((ALLREDUCE, self.sums, self.reduced, 3))
        start = [(GRAPH, cap(lambda s: (self._cg1_update(s, True), self._pack(s, self.z))))] + product
        head = cap(lambda s: (self._decide(s), self._cg1_update(s, False), self._pack(s, self.z)))
        return start, [(GRAPH, head)] + product, decide

    def _run_steps(self, steps, events=None):
        """Enqueue ``steps``; with ``events``, time each communication step on the main stream.

        Returns the number of events recorded: intervals between consecutive
        events alternate compute, communication, compute, ...
        """
        s, c = self.stream, self.comm_stream
        used = 0
        if events is not None:
            events[0].record(s)
            used = 1
        for step in steps:
            kind = step[0]
            if kind == GRAPH:
                step[1].launch(s)
                continue
            if kind == HALO_START:  # off the main stream: overlaps what the main stream does next
                self.ev_packed.record(s)
                c.wait_event(self.ev_packed)
                self.nccl.exchange(self._transfers, c)
                self.ev_halo.record(c)
                continue
            if events is not None:
                events[used].record(s)
            if kind == HALO:
                self.nccl.exchange(self._transfers, s)
            elif kind == HALO_WAIT:
                s.wait_event(self.ev_halo)
            else:
                self.nccl.allreduce(*step[1:], s)
            if events is not None:
                events[used + 1].record(s)
                used += 2
        if events is not None:
            events[used].record(s)
            used += 1
        return used

    # -- solving ------------------------------------------------------------------
    def _exchange(self, v):
        """Halo of ``v`` into self.halo (outside the iteration: residuals)."""
        s = self.stream
        self._pack(s, v)
        self._run_steps([(HALO,)])

    def _residual(self, x, out):
        """out = b - A x over the owned rows."""
        self._exchange(x)
        self.k["matrix_residual"]((self.grid_spmv,), (BLOCK,),
                               (self.rowptr, self.col, self.val, x, self.b, out, np.int32(self.n)),
                               stream=self.stream)
        self._halo_product(self.stream, self.halo, out, -1, np.uint64(0))

    def _global_dot(self, u, v):
        with self.stream:
            local = float(self.cupy.dot(u, v))
        return self.comm.allreduce(local)

    def norm(self, v):
        with self.stream:  # a host v is copied on the stream that reads it
            v = self.cupy.asarray(v)
            return float(np.sqrt(self._global_dot(v, v)))

    def _reset(self, tol, maxiter):
        st = np.zeros(1, dtype=STATE_DTYPE)
        st["tol"], st["maxiter"], st["status"], st["iteration"] = tol, maxiter, RUNNING, -1
        self.state.set(st.view(np.uint8), stream=self.stream)
        self.shadow.fill(0)
        self.pending.fill(0)
        for v in (self.p0, self.p1, self.p, self.s, self.halo_p):
            if v is not None:
                v.fill(0)

    def _ensure_history(self, maxiter, record_history):
        wanted = record_history and (self.history is None or self.history.size < maxiter + 1)
        if wanted:
            self.history = self.cupy.zeros(maxiter + 1, dtype=self.cupy.float64)
            self.history_arg = self.history
            self._graphs = None  # the history pointer is baked into the graphs
        if self._graphs is None:
            with self.stream:
                self._graphs = self._build_steps()

    def _status(self):
        return self.state.get(stream=self.stream).view(STATE_DTYPE)[0]

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
        self._run_steps(start)
        events = [cupy.cuda.Event() for _ in range(2 + 2 * len(iteration))]
        sampled_comm = sampled_total = 0.0
        t0 = time.perf_counter()
        launched = 0
        while True:
            # The device stops by itself at maxiter; this bound only guards the host loop.
            if launched > maxiter + self.check_every:
                raise RuntimeError("device loop did not stop at maxiter")
            for i in range(self.check_every):
                # Time one iteration per block, when the pipeline is full.
                used = self._run_steps(iteration, events if i == self.check_every - 1 else None)
            launched += self.check_every
            decide.launch(self.stream)
            st = self._status()  # synchronises: one host read per check_every iterations
            ms = [cupy.cuda.get_elapsed_time(events[j], events[j + 1]) for j in range(used - 1)]
            sampled_total += sum(ms)
            sampled_comm += sum(ms[1::2])
            if int(st["status"]) != RUNNING:
                break
            self.step_times = ms  # a full iteration: the solve was still running after it
        self.loop_time = time.perf_counter() - t0
        if sampled_total > 0:
            self.communication_time += self.loop_time * sampled_comm / sampled_total
        reason = Reason(int(st["status"]))
        its = int(st["iteration"])
        history = self.history[: its + 1].get() if record_history else None
        return self.x.copy(), reason, its, float(st["rnorm"]), history

    def true_residual_norm(self, b, x):
        """``||b - A x||`` over all ranks, for the ``b`` of the last solve (already on the device)."""
        with self.stream:
            self._residual(x, self.scratch)
            return self.norm(self.scratch)
