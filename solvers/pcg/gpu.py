"""PCG on one GPU: fixed device buffers, the iteration bodies, and their engine.

Everything is allocated and compiled here at set-up; a solve copies ``b`` (and
``x0``) into the fixed buffers, resets the device state and runs the engine.
"""
import time

import numpy as np

from .. import kernels
from ..kernels.pcg_ref import RUNNING

from ..backend import require_cupy
from ..engine import GraphEngine
from ..errors import DeviceError, InputError
from .layout import MatrixLayout
from .cpu import resolve_variant
from .preconditioners import jacobi_inverse_diagonal
from .result import Reason

BLOCK = 256  # threads per block of the plain kernels (kernels/pcg.cu)


def run_block(n):
    """Threads per block of the persistent kernels for ``n`` rows.

    Small grids want many small blocks (more SMs at work), larger ones fewer big
    blocks (cheaper grid reductions). H200, us per iteration at 32 iterations a
    launch, blocks of 256 / 512 / 1024 threads: 2D Poisson 64^2 5.7 / 6.0 / 7.2
    (single-reduction), 256^2 7.5 / 6.7 / 7.7 (single-reduction), 3D 64^3 15.6 /
    13.8 / 13.2 (classic), 2D 1024^2 55.1 / 53.5 / 47.1 (classic).
    """
    return 256 if n <= 16_384 else 512 if n <= 131_072 else 1024
# Host mirror of `struct State` in kernels/pcg.cu.
STATE_DTYPE = np.dtype([("rz", "f8"), ("alpha", "f8"), ("beta", "f8"), ("tol", "f8"), ("rnorm", "f8"),
                        ("pq", "f8"), ("alpha_prev", "f8"), ("iteration", "i4"), ("maxiter", "i4"),
                        ("status", "i4"), ("parity", "i4"), ("ticket", "u4"), ("pad", "i4")])
PROGRESS_DTYPE = np.dtype([("rnorm", "f8"), ("iteration", "i4"), ("status", "i4")])


def to_device_csr(A, dtype):
    """Any supported matrix as a cupyx CSR matrix of ``dtype`` with int32 indices, on the device."""
    cupy = require_cupy()
    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp

    if csp.issparse(A):
        M = A.tocsr().astype(dtype)
    elif sp.issparse(A):
        M = csp.csr_matrix(sp.csr_matrix(A, dtype=dtype))
    else:
        dense = cupy.asarray(A) if hasattr(A, "__cuda_array_interface__") else None
        if dense is None and hasattr(A, "__dlpack__"):
            dense = cupy.from_dlpack(A)
        if dense is None:
            dense = cupy.asarray(np.asarray(A))
        if dense.ndim != 2:
            raise InputError(f"A must be 2-D, got shape {dense.shape}")
        M = csp.csr_matrix(dense.astype(dtype))
    M.sum_duplicates()
    return M


class _HostMapped:
    """A small struct in pinned, device-mapped host memory (written by kernels, read by the host)."""

    def __init__(self, dtype):
        cupy = require_cupy()
        self._mem = cupy.cuda.alloc_pinned_memory(dtype.itemsize)
        self.host = np.frombuffer(self._mem, dtype=dtype, count=1)
        self.host[...] = 0
        # With unified addressing a pinned host pointer is valid on the device as is.
        self.device_ptr = self._mem.ptr


class PCGBody:
    """One launch of the variant's persistent kernel: ``iterations_per_launch`` PCG iterations."""

    def __init__(self, solver):
        self.s = solver

    def launch(self, stream, loop):
        self.s.launch_run(self.s.iterations_per_launch, loop.handle, stream)


class GPUPCG:
    """Set-up-once PCG on the GPU, driven by :class:`~solvers.engine.GraphEngine`."""

    device = "gpu"

    def __init__(self, A, preconditioner, dtype, mode, unroll, record_history, variant="auto"):
        cupy = require_cupy()
        if preconditioner not in ("none", "jacobi"):
            raise InputError(f"preconditioner {preconditioner!r} is not available on the GPU")
        self.cupy = cupy
        self.requested_variant = variant
        self.dtype = np.dtype(dtype)
        self.preconditioner = preconditioner
        self.record_history = record_history
        self.device_name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
        try:
            self._setup(A)
        except cupy.cuda.memory.OutOfMemoryError as exc:
            raise DeviceError(f"out of GPU memory while setting up the solver ({exc})") from None
        # The kernel itself runs `unroll` iterations a launch: the engine launches it once a pass.
        self.unroll = self.iterations_per_launch = int(unroll)
        self.engine = GraphEngine(PCGBody(self), mode=mode, unroll=1)
        self.mode_note = self.engine.note

    # -- set-up ---------------------------------------------------------------
    def _setup(self, A):
        cupy = self.cupy
        M = to_device_csr(A, self.dtype)
        self.shape = M.shape
        if M.shape[0] != M.shape[1]:
            raise InputError(f"A must be square, got shape {M.shape}")
        n, nnz = M.shape[0], int(M.nnz)
        if n >= 2**31 - 1 or nnz >= 2**31 - 1:
            raise InputError("matrices with 2^31 or more rows or entries are not supported (int32 indices)")
        self.n = n
        self.variant = resolve_variant(self.requested_variant, n, "gpu")
        indptr = cupy.ascontiguousarray(M.indptr.astype(cupy.int32))
        indices = cupy.ascontiguousarray(M.indices.astype(cupy.int32))
        data = M.data.astype(self.dtype)
        self._check_values(data)
        self._pattern = (indptr, indices)
        self.layout = MatrixLayout(indptr, indices, cupy)
        self.rowptr, self.col = self.layout.rowptr, self.layout.col
        self.val = self.layout.values(data)

        self.run_block = run_block(n)
        defines = self.layout.defines + (("RUN_BLOCK", str(self.run_block)),)
        mod = kernels.module("pcg", kernels.ctype(self.dtype), defines)
        self.k_residual = mod.get_function("matrix_residual")
        single = self.variant == "single-reduction"
        self._run, capacity = kernels.cooperative(mod.get_function("pcg1_run" if single else "pcg_run"),
                                                  self.run_block)

        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        # The residual kernel strides over the rows with enough blocks to fill the GPU; the
        # persistent kernel takes one row (group) a thread up to the blocks the GPU holds at once.
        self.grid_spmv = int(max(1, min(-(-n // (BLOCK // self.layout.lanes)), sms * 8)))
        self.grid = int(max(1, min(-(-n // (self.run_block // self.layout.lanes)), capacity)))

        zeros = lambda: cupy.zeros(n, dtype=self.dtype)  # noqa: E731
        self.x, self.b, self.r, self.p0 = (zeros() for _ in range(4))
        # classic: z, q and the second direction buffer p1; single-reduction: p is p0 and r is r0 of
        # the pairs (r, r1), (s0, s1), (w0, w1)
        self.z, self.q, self.p1 = (None if single else zeros() for _ in range(3))
        self.r1, self.s0, self.s1, self.w0, self.w1 = (zeros() if single else None for _ in range(5))
        self.dinv = zeros() if self.preconditioner == "jacobi" else None
        self.dinv_arg = self.dinv if self.dinv is not None else np.uint64(0)
        # the persistent kernel's reduction slots (`struct Slot`, 32 bytes: two buffers of one a block)
        # and the tag its next launch starts from
        self.slots = cupy.zeros(2 * self.grid * 4, dtype=cupy.float64)
        self.epoch = cupy.zeros(1, dtype=cupy.uint32)
        self.state = cupy.zeros(STATE_DTYPE.itemsize, dtype=cupy.uint8)
        self.progress = _HostMapped(PROGRESS_DTYPE)
        self.history = None
        self.history_arg = np.uint64(0)
        self._set_diagonal(M)

    @staticmethod
    def _check_values(val):
        if not bool(val.size) or not bool(require_cupy().isfinite(val).all()):
            raise InputError("A has NaN or Inf entries" if val.size else "A has no nonzero entries")

    def _set_diagonal(self, M):
        if self.dinv is None:
            return
        self.dinv[...] = jacobi_inverse_diagonal(M.diagonal().astype(self.dtype))  # in place: captured address

    @property
    def mode(self):
        return self.engine.mode

    @property
    def instantiations(self):
        return self.engine.instantiations

    def update_values(self, A):
        """New values in place (same pattern: the graph is kept), else a fresh set-up."""
        cupy = self.cupy
        M = to_device_csr(A, self.dtype)
        if M.shape != self.shape:
            raise InputError(f"new matrix has shape {M.shape}, expected {self.shape}")
        indptr, indices = self._pattern
        same = (int(M.nnz) == indices.size and bool(cupy.array_equal(M.indptr, indptr))
                and bool(cupy.array_equal(M.indices, indices)))
        if same:
            data = M.data.astype(self.dtype)
            self._check_values(data)
            self.layout.values(data, out=self.val)
            self._set_diagonal(M)
            return
        self._setup(M)
        self.engine.invalidate()

    # -- solving --------------------------------------------------------------
    def check_vector(self, v, name):
        """``v`` as a device vector of the solver's dtype (device inputs are not copied to the host)."""
        cupy = self.cupy
        if hasattr(v, "__cuda_array_interface__"):
            v = cupy.asarray(v)
        elif hasattr(v, "__dlpack__") and not isinstance(v, np.ndarray):
            try:
                v = cupy.from_dlpack(v)
            except Exception:
                v = np.asarray(v)
        if isinstance(v, np.ndarray) or not isinstance(v, cupy.ndarray):
            v = np.asarray(v)
            if np.iscomplexobj(v) or not np.issubdtype(v.dtype, np.number):
                raise InputError(f"{name} must be real, got dtype {v.dtype}")
        if v.ndim == 2 and 1 in v.shape:
            v = v.reshape(-1)
        if v.shape != (self.n,):
            raise InputError(f"{name} has shape {v.shape}, expected ({self.n},)")
        return cupy.asarray(v, dtype=self.dtype)

    def norm(self, v):
        return float(self.cupy.linalg.norm(v))

    def _ensure_history(self, maxiter):
        if not self.record_history:
            return
        if self.history is None or self.history.size < maxiter + 1:
            self.history = self.cupy.zeros(maxiter + 1, dtype=self.cupy.float64)
            self.history_arg = self.history
            self.engine.invalidate()  # the history pointer is baked into the graph

    def _reset_state(self, tol, maxiter):
        st = np.zeros(1, dtype=STATE_DTYPE)
        st["tol"], st["maxiter"], st["status"], st["iteration"] = tol, maxiter, RUNNING, -1  # -1: set-up pass
        self.state.set(st.view(np.uint8))
        self.progress.host[...] = 0

    def launch_run(self, count, handle, stream=None):
        """Enqueue one launch of the persistent kernel: up to ``count`` iterations (or the set-up pass)."""
        if self.variant == "single-reduction":
            vectors = (self.x, self.p0, self.r, self.r1, self.s0, self.s1, self.w0, self.w1)
        else:
            vectors = (self.x, self.r, self.z, self.q, self.p0, self.p1)
        self._run(self.grid, (self.rowptr, self.col, self.val, self.dinv_arg, *vectors, self.state, self.slots,
                              self.epoch, self.history_arg, self.progress.device_ptr, handle,
                              np.int32(self.n), np.int32(count)), stream=stream)

    def _start(self, tol, maxiter):
        """Reset the device state and run the set-up pass (r holds b - A x0; zero first directions)."""
        for v in (self.p0, self.s0, self.w0):
            if v is not None:
                v.fill(0)
        self._reset_state(tol, maxiter)
        self.launch_run(1, np.uint64(0))

    def _residual(self, x, out):
        self.k_residual((self.grid_spmv,), (BLOCK,), (self.rowptr, self.col, self.val, x, self.b, out,
                                                      np.int32(self.n)))

    def solve(self, b, x0, tol, maxiter, callback, record_history, on_progress=None):
        """Return ``(x, reason, iterations, rnorm, history)``; ``x`` is a new CuPy array.

        ``on_progress(iteration, rnorm)`` is called about ten times a second while
        the device runs, from host-mapped memory the decide step writes.
        """
        cupy = self.cupy
        if maxiter >= 2**31 - 1:
            raise InputError("maxiter must be below 2^31")
        self._ensure_history(maxiter)
        self.b[...] = b
        if x0 is None:
            self.x.fill(0)
            self.r[...] = self.b
        else:
            self.x[...] = x0
            self._residual(self.x, self.r)
        self._start(tol, maxiter)
        cupy.cuda.Device().synchronize()
        prog = self.progress.host
        seen = [0]

        def done():
            if callback is None:  # the progress word is exact once the device loop has stopped
                return int(prog["status"][0]) != RUNNING
            st = self.state.get().view(STATE_DTYPE)[0]  # exact every iteration, for the callback
            if int(st["iteration"]) > seen[0]:
                seen[0] = int(st["iteration"])
                callback(self.x)
            return int(st["status"]) != RUNNING

        def on_wait():
            on_progress(int(prog["iteration"][0]), float(prog["rnorm"][0]))

        # A callback must see every iteration: one iteration a launch, plain launches, a host check each.
        self.iterations_per_launch = 1 if callback is not None else self.unroll
        t0 = time.perf_counter()
        try:
            self.engine.run(done, max(maxiter, 1), eager=callback is not None,
                            on_wait=on_wait if on_progress is not None else None)
        finally:
            self.iterations_per_launch = self.unroll
        self.last_loop_time = time.perf_counter() - t0
        st = self.state.get().view(STATE_DTYPE)[0]
        reason = Reason(int(st["status"]))
        if reason is Reason.RUNNING:
            raise RuntimeError("device loop ended without a stop reason (engine bound reached)")
        its = int(st["iteration"])
        history = self.history[: its + 1].get() if self.record_history else None
        return self.x.copy(), reason, its, float(st["rnorm"]), history

    def true_residual_norm(self, b, x):
        w = self.cupy.empty_like(self.r)
        self._residual(x, w)
        return float(self.cupy.linalg.norm(w))
