"""The GPU apply of the preconditioners that are not pointwise: a fixed sequence of kernel launches.

A preconditioner whose ``variants`` name the GPU and that is not ``pointwise``
implements :meth:`~.base.Preconditioner.device_apply`: given a
:class:`DeviceProgram`, it appends the launches that compute ``z = M^{-1} r``
(products, Chebyshev steps, Jacobi sweeps, transfers between levels) on buffers
the program allocates once. The solver then enqueues the whole sequence inside
its iteration body (:meth:`DeviceProgram.launch`): nothing is allocated and
nothing waits for the host there, so the body can be captured into a graph, and
every launch of the same sequence gives the same bits.

The kernels are ``kernels/precond.cu``; matrices (SciPy or cupyx CSR, or a dense
array) are held as CSR with a few threads a row, uploaded once whatever their
origin. The program stores everything in one precision (``dtype``), which may
be lower than the solver's: ``r`` is then converted on the way in and ``z`` on
the way out.
"""
import numpy as np

from ... import kernels
from ...backend import require_cupy
from ...formats.csr import row_lanes
from ...kernels.structs import Struct

BLOCK = 256  # threads a block of every kernel in precond.cu

CSR_MATRIX = Struct("CsrMatrix", [("rowptr", "const int*"), ("col", "const int*"), ("val", "const real_t*"),
                                  ("rows", "int"), ("lanes", "int")])


class DeviceMatrix:
    """A matrix on the device as CSR with int32 indices, its kernel struct and its product's work items."""

    def __init__(self, M, dtype):
        cupy = require_cupy()
        import cupyx.scipy.sparse as csp
        import scipy.sparse as sp

        if csp.issparse(M):
            M = M.tocsr()
        elif sp.issparse(M):
            M = csp.csr_matrix(sp.csr_matrix(M))
        else:  # a dense array (the coarsest level's inverse): every entry stored
            M = csp.csr_matrix(cupy.asarray(M))
        self.shape = M.shape
        self.indptr = cupy.ascontiguousarray(M.indptr, dtype=cupy.int32)
        self.indices = cupy.ascontiguousarray(M.indices, dtype=cupy.int32)
        self.data = cupy.ascontiguousarray(M.data, dtype=dtype)
        lanes = row_lanes(self.data.size, self.shape[0])
        self.struct = CSR_MATRIX.pack(rowptr=self.indptr, col=self.indices, val=self.data, rows=self.shape[0],
                                      lanes=lanes)
        self.work = self.shape[0] * lanes  # threads a product can keep busy


class DeviceProgram:
    """Launches of ``kernels/precond.cu`` computing ``z = M^{-1} r`` on buffers fixed at set-up.

    Parameters
    ----------
    r, z : cupy.ndarray
        The solver's residual and preconditioned residual (its precision).
    dtype : numpy dtype
        The precision the preconditioner is stored and applied in.
    stop : int
        Device address of an ``int``: every launch does nothing while it is non-zero
        (the solver's status word); 0 for none.

    Attributes
    ----------
    input, output : cupy.ndarray
        ``r`` and ``z`` in ``dtype`` (the solver's own buffers when the precisions agree).
    """

    def __init__(self, r, z, dtype, stop=0):
        cupy = require_cupy()
        self.cupy = cupy
        self.dtype = np.dtype(dtype)
        self.n = int(r.size)
        self._stop = np.uint64(stop)
        mod = kernels.module("precond", real=kernels.ctype(self.dtype),
                             defines=(("outer_t", kernels.ctype(r.dtype)),), structs=(CSR_MATRIX,))
        self._kernels = {name: mod.get_function(name) for name in (
            "csr_axpby", "chebyshev_begin", "chebyshev_step", "scaled_add", "to_inner", "to_outer")}
        # grid-stride kernels: at most the blocks the GPU holds at once, so none waits for a second wave
        self._capacity = {name: kernels.resident_blocks(k, BLOCK) for name, k in self._kernels.items()}
        self._launches = []
        self._uploads = {}   # id of a host or device object -> (the object, its device copy)
        self._scratch = {}
        same = r.dtype == self.dtype
        self.input = r if same else cupy.zeros(self.n, dtype=self.dtype)
        self.output = z if same else cupy.zeros(self.n, dtype=self.dtype)
        self._z = None if same else z
        if not same:
            self._add("to_inner", self.n, np.int32(self.n), r, self.input)

    # -- what the sequence works on -------------------------------------------

    def _upload(self, obj, make):
        key = id(obj)
        if key not in self._uploads:  # the object is kept alongside, so its id is never reused
            self._uploads[key] = (obj, make(obj))
        return self._uploads[key][1]

    def matrix(self, M):
        """``M`` (SciPy or cupyx sparse, or dense) on the device, uploaded on first use."""
        return self._upload(M, lambda m: DeviceMatrix(m, self.dtype))

    def vector(self, v):
        """``v`` (NumPy or CuPy) on the device in the program's precision, uploaded on first use."""
        return self._upload(v, lambda a: self.cupy.ascontiguousarray(self.cupy.asarray(a), dtype=self.dtype))

    def scratch(self, owner, name, n):
        """A work vector of ``n`` entries that belongs to ``owner`` (the same one at every call)."""
        key = (id(owner), name)
        if key not in self._scratch:
            self._scratch[key] = (owner, self.cupy.zeros(n, dtype=self.dtype))
        return self._scratch[key][1]

    # -- the launches -----------------------------------------------------------
    def _add(self, name, work, *args):
        """Append a launch of ``name`` over ``work`` items (threads): enough blocks to fill the GPU, no more."""
        grid = int(max(1, min(-(-work // BLOCK), self._capacity[name])))
        self._launches.append((self._kernels[name], grid, args + (self._stop,)))

    def axpby(self, M, v, y, out, a=1.0, c=1.0):
        """``out = a M v + c y`` (``y`` None: ``a M v``); ``M`` from :meth:`matrix`. ``out`` may be ``y``."""
        real = self.dtype.type
        self._add("csr_axpby", M.work, M.struct, v, np.uint64(0) if y is None else y, out, real(a), real(c))

    def chebyshev_begin(self, b, dinv, first, x, d, rs, accumulate):
        """``rs = D^-1 b``, ``d = first rs``, ``x = d`` (``x += d`` when ``accumulate``)."""
        self._add("chebyshev_begin", x.size, np.int32(x.size), b, dinv, self.dtype.type(first), x, d,
                  rs, np.int32(accumulate))

    def chebyshev_step(self, A, dinv, d_old, d_new, rs, x, c1, c2):
        """``rs -= D^-1 A d_old``, ``d_new = c1 d_old + c2 rs``, ``x += d_new``."""
        real = self.dtype.type
        self._add("chebyshev_step", A.work, A.struct, dinv, d_old, d_new, rs, x, real(c1), real(c2))

    def scaled_add(self, s, v, x, accumulate):
        """``x = s v`` (``x += s v`` when ``accumulate``), entry by entry."""
        self._add("scaled_add", x.size, np.int32(x.size), s, v, x, np.int32(accumulate))

    def close(self):
        """End the sequence: ``z`` from :attr:`output` when the precisions differ."""
        if self._z is not None:
            self._add("to_outer", self.n, np.int32(self.n), self.output, self._z)
            self._z = None
        return self

    def launch(self, stream=None):
        """Enqueue the whole sequence on ``stream``."""
        for kernel, grid, args in self._launches:
            kernel((grid,), (BLOCK,), args, stream=stream)

    @property
    def launches(self):
        """Kernel launches an application takes."""
        return len(self._launches)
