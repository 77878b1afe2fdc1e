"""Several right-hand sides of one matrix on the GPU: classic PCG on all k columns at once.

``PCG.solve`` with ``b`` of shape ``(n, k)`` comes here on the GPU
(:mod:`.solver` checks, scales and reorders the columns, as for one).
The vectors are ``(n, k)`` row-major, so every matrix entry read serves the k
columns (``kernels/multirhs.cu``); each column has its own step lengths, stop
reason and iteration count on the device, and stops (is frozen) on its own.
An iteration is two kernels in the graph engine's body, so ``while`` mode runs
the whole solve as one graph launch.
"""
import time

import numpy as np

from .. import kernels
from ..engine import GraphEngine
from ..errors import InputError
from ..formats import ELL
from ..kernels.pcg_ref import RUNNING
from ..kernels.structs import PROGRESS, STATE, Struct
from ..resources import require_device_memory

MR_BLOCK = 512  # threads a block of the kernels (MR_BLOCK in kernels/multirhs.cu)
MAX_COLUMNS = MR_BLOCK // 2  # a block reduces two sums of every column at once
_VECTORS = ("x", "r", "p0", "p1")

MULTI_RUN = Struct("MultiRun", [
    ("rowptr", "const int*"), ("col", "const int*"), ("val", "const real_t*"), ("dinv", "const real_t*"),
    *((v, "real_t*") for v in _VECTORS), ("st", "State*"), ("partials", "double*"), ("ticket", "unsigned int*"),
    ("n", "int"), ("pad", "int")])


def columns_per_thread(columns):
    """Columns a thread of the kernels holds (MR_CPT): two, loaded as one vector, when ``columns`` is even."""
    return 2 if columns % 2 == 0 else 1


def kernel_program(real, columns, ell_width=None):
    """Arguments of :func:`kernels.module` for the kernels over ``columns`` right-hand sides, reading
    the matrix as ELL of ``ell_width`` entries a row, or as CSR (None)."""
    defines = (("NRHS", str(columns)), ("MR_CPT", str(columns_per_thread(columns))))
    defines += (("MR_ELL_WIDTH", str(ell_width)),) if ell_width else ()
    return dict(name="multirhs", real=real, defines=defines, before=("stopping",),
                structs=(STATE, PROGRESS, MULTI_RUN))


def refuse_columns(columns):
    """Raise :class:`InputError` unless the kernels take ``columns`` right-hand sides at once."""
    if not 1 <= columns <= MAX_COLUMNS:
        raise InputError(f"b has {columns} columns; at most {MAX_COLUMNS} right-hand sides are solved at once "
                         f"(solve the columns in groups)")


class GPUMultiRHS:
    """Classic PCG on ``columns`` right-hand sides over the matrix of a :class:`~.gpu.GPUPCG`.

    Reads that solver's device matrix (its CSR pattern and values) and Jacobi
    diagonal; holds its own ``(n, columns)`` vectors, per-column States and engine.

    Parameters
    ----------
    solver : GPUPCG
        A solver with a pointwise preconditioner (none or Jacobi).
    columns : int
    mode : {"auto", "eager", "graph", "while"}
    unroll : int
        Iterations a graph launch (``graph``) or a WHILE pass (``while``) holds.
    """

    def __init__(self, solver, columns, mode, unroll):
        refuse_columns(columns)
        cupy = self.cupy = solver.cupy
        self.n, self.columns, self.dtype = solver.n, int(columns), solver.dtype
        indptr, indices = solver._pattern
        itemsize = self.dtype.itemsize
        # ELL's slots, or DIA's with the columns written out where it holds every entry in them
        ell = isinstance(solver.format, ELL) and not solver.format.exceptions
        # what is laid out besides the solver's arrays: DIA's columns written out, or the values in CSR order
        laid_out = solver.format.size * 4 - solver.format.index_bytes() if ell else indices.size * itemsize
        require_device_memory((len(_VECTORS) + 2) * self.n * self.columns * itemsize + laid_out,
                              f"a PCG solve of {self.n:,} rows and {self.columns} right-hand sides")
        if ell:  # the solver's own arrays
            self.rowptr, self.col, self.val = None, solver.format.slot_columns(), solver.val
        else:  # CSR: the pattern, and the values back in its order from the format's
            self.rowptr, self.col = indptr, indices
            self.val = solver.format.csr_values(solver.val)
        numbering = solver.numbering  # the fused solver's own numbering of its vectors, where its format has one
        self.dinv = solver.dinv if numbering is None or solver.dinv is None else numbering.backward(solver.dinv)
        mod = kernels.module(**kernel_program(kernels.ctype(self.dtype), self.columns,
                                              solver.format.width if ell else None))
        self._direction, self._update, self._residual = (mod.get_function(k) for k in
                                                         ("mr_direction", "mr_update", "mr_residual"))
        rows_per_block = MR_BLOCK * columns_per_thread(self.columns) // self.columns
        capacity = min(kernels.resident_blocks(k, MR_BLOCK) for k in (self._direction, self._update))
        self.grid = int(max(1, min(-(-self.n // rows_per_block), capacity)))  # one wave
        shape = (self.n, self.columns)
        self.vectors = {v: cupy.zeros(shape, dtype=self.dtype) for v in _VECTORS}
        self.x = self.vectors["x"]
        self.b = cupy.zeros(shape, dtype=self.dtype)
        self.states = cupy.zeros(self.columns * STATE.dtype.itemsize, dtype=cupy.uint8)
        self.partials = cupy.zeros(2 * self.columns * self.grid, dtype=cupy.float64)
        self.ticket = cupy.zeros(1, dtype=cupy.uint32)
        self._args = MULTI_RUN.pack(rowptr=self.rowptr, col=self.col, val=self.val, dinv=self.dinv, st=self.states,
                                    partials=self.partials, ticket=self.ticket, n=self.n, **self.vectors)
        self.unroll = int(unroll)
        self.engine = GraphEngine(self.launch_body, mode=mode, unroll=self.unroll)
        self.mode, self.mode_note = self.engine.mode, self.engine.note

    @property
    def instantiations(self):
        return self.engine.instantiations

    def launch_body(self, stream, loop):
        """The engine's body: one iteration."""
        self.launch_iteration(loop.handle, stream)

    def launch_iteration(self, handle, stream=None):
        """Enqueue one iteration (``handle``: the WHILE node's, or 0)."""
        args = (self._args, np.uint64(handle))
        self._direction((self.grid,), (MR_BLOCK,), args, stream=stream)
        self._update((self.grid,), (MR_BLOCK,), args, stream=stream)

    def residual(self, x, out):
        """``out = b - A x`` over every column."""
        self._residual((self.grid,), (MR_BLOCK,), (self._args, x, self.b, out))

    def read_states(self):
        """The k device States (a NumPy structured array)."""
        return self.states.get().view(STATE.dtype)

    def solve(self, b, x0, tol, maxiter):
        """Run every column to its stop.

        Parameters
        ----------
        b, x0 : cupy.ndarray
            ``(n, k)`` C-contiguous arrays of the solver's dtype (x0 may be None: zero).
        tol : ndarray
            Each column's absolute threshold on ``||r||``.
        maxiter : int

        Returns
        -------
        x : cupy.ndarray
            A new ``(n, k)`` array.
        states : ndarray
            The columns' final States (status, iteration, rnorm, ...).
        true_norms : ndarray
            ``||b - A x||`` of each column, recomputed.
        loop_time, capture_time : float
        """
        cupy = self.cupy
        if maxiter >= 2**31 - 1:
            raise InputError("maxiter must be below 2^31")
        self.b[...] = b
        r = self.vectors["r"]
        if x0 is None:
            self.x.fill(0)
            r[...] = self.b
        else:
            self.x[...] = x0
            self.residual(self.x, r)
        self.vectors["p0"].fill(0)
        states = np.zeros(self.columns, dtype=STATE.dtype)
        states["tol"], states["maxiter"], states["status"], states["iteration"] = tol, maxiter, RUNNING, -1
        self.states.set(states.view(np.uint8))
        self._update((self.grid,), (MR_BLOCK,), (self._args, np.uint64(0)))  # the set-up pass
        cupy.cuda.Device().synchronize()

        def done():
            return not (self.read_states()["status"] == RUNNING).any()

        t0 = time.perf_counter()
        self.engine.run(done, max(maxiter, 1), check_every=self.unroll)
        capture_time = self.engine.build_time
        loop_time = time.perf_counter() - t0 - capture_time
        states = self.read_states()
        if (states["status"] == RUNNING).any():
            raise RuntimeError("device loop ended with a column still running (engine bound reached)")
        w = cupy.empty_like(self.x)
        self.residual(self.x, w)
        true_norms = cupy.linalg.norm(w, axis=0).get()
        return self.x.copy(), states, true_norms, loop_time, capture_time
