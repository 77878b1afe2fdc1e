"""The GPU apply of the preconditioners that are not pointwise: a fixed sequence of kernel launches.

A preconditioner whose ``variants`` name the GPU and that is not ``pointwise``
implements :meth:`~.base.Preconditioner.device_apply`: given a
:class:`DeviceProgram`, it appends the launches that compute ``z = M^{-1} r``
(products, Chebyshev steps, Jacobi sweeps, transfers between levels) on buffers
the program allocates once. The solver then enqueues the whole sequence inside
its iteration body (:meth:`DeviceProgram.launch`): nothing is allocated and
nothing waits for the host there, so the body can be captured into a graph, and
every launch of the same sequence gives the same bits.

The kernels are ``kernels/precond.cu`` (those with a product) and
``kernels/precond_pointwise.cu``. Matrices (SciPy or cupyx CSR, or a dense
array) are laid out once, on the device, in the formats the PCG kernels use
(:mod:`solvers.formats`), and ``precond.cu`` is compiled once for each layout's
format. The program stores everything in one precision (``dtype``), which may
be lower than the solver's: ``r`` is then converted on the way in and ``z`` on
the way out.
"""
import contextlib

import numpy as np

from ... import kernels
from ...backend import require_cupy
from ...formats import choose_format

BLOCK = 256  # threads a block of every kernel in precond.cu and precond_pointwise.cu
#: Matrices of fewer rows than this (a hierarchy's small levels and their restrictions) are laid out as
#: CSR, which needs no layout work: SELL's layout costs a few milliseconds whatever the size (tens of
#: small launches), and a product this small is bound by latency, where its sorting and padding buy nothing.
SMALL_ROWS = 65_536


def layout_for(shape, finest_rows, dense=False):
    """The matrix format a preconditioner matrix of ``shape`` is laid out in.

    The finest level's operator (square, the solver's ``finest_rows``) takes the
    format the PCG kernels would (ELL for a stencil); every other square matrix
    and every one with fewer rows than columns (a restriction) takes SELL, whose
    few variants (1 to 8 lanes a row) keep the modules compiled for a hierarchy
    few. A matrix with more rows than columns (a prolongation) takes CSR: the
    padding of ELL and SELL reads the vector at the entry's own row, which lies
    beyond such a matrix's columns. A ``dense`` one (the coarsest level's inverse)
    takes CSR too (its rows are all equally long), and so does any other with fewer
    than :data:`SMALL_ROWS` rows.
    """
    rows, cols = shape
    if rows == cols == finest_rows:
        return "auto"
    return "csr" if rows > cols or dense or rows < SMALL_ROWS else "sell"


class DeviceMatrix:
    """A matrix laid out on the device in a :mod:`solvers.formats` format, its kernel struct and work items.

    Attributes
    ----------
    source : object
        The matrix it was laid out from.
    format : solvers.formats.base.MatrixFormat
        The layout (its ``defines`` and struct select the compiled ``precond.cu``).
    struct : numpy structured scalar
        The kernels' ``Matrix`` argument.
    work : int
        Threads a product can keep busy.

    Parameters
    ----------
    M : SciPy or cupyx sparse matrix, or a dense array
    dtype : numpy dtype
        Precision of the values laid out.
    finest_rows : int
        Rows of the solver's matrix (:func:`layout_for`).
    layout : solvers.formats.base.MatrixFormat, optional
        A layout of ``M``'s pattern that exists already (the solver's own, for its
        matrix): only the values are laid out, in ``dtype``.
    """

    def __init__(self, M, dtype, finest_rows, layout=None):
        cupy = require_cupy()
        import cupyx.scipy.sparse as csp
        import scipy.sparse as sp

        self.source = M
        dense = not (csp.issparse(M) or sp.issparse(M))
        if csp.issparse(M):
            M = M.tocsr()
        elif sp.issparse(M):
            M = csp.csr_matrix(sp.csr_matrix(M))
        else:  # a dense array (the coarsest level's inverse): every entry stored
            M = csp.csr_matrix(cupy.asarray(M))
        self.shape = M.shape
        if layout is None:
            indptr = cupy.ascontiguousarray(M.indptr, dtype=cupy.int32)
            indices = cupy.ascontiguousarray(M.indices, dtype=cupy.int32)
            layout = choose_format(indptr, indices, cupy, layout_for(self.shape, finest_rows, dense))
        self.format = layout
        self.values = self.format.values(cupy.ascontiguousarray(M.data, dtype=dtype))
        self.struct = self.format.pack(self.values)
        self.work = int(self.format.threads())


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
    laid_out : tuple (matrix, layout), optional
        A matrix the solver has laid out already (its own) and that layout: products
        with that very matrix object use it (:class:`DeviceMatrix`'s ``layout``).
    converted : cupy.ndarray, optional
        ``r`` in ``dtype``, kept so by the caller (the solver's update writes both):
        the sequence reads it as its input instead of converting ``r`` first.

    Attributes
    ----------
    input, output : cupy.ndarray
        ``r`` and ``z`` in ``dtype`` (the solver's own buffers when the precisions agree).
    labels : list of str
        What each launch is part of (the :meth:`section` it was appended in), for timings.
    """

    def __init__(self, r, z, dtype, stop=0, laid_out=None, converted=None):
        cupy = require_cupy()
        self.cupy = cupy
        self._laid_out = laid_out
        self.dtype = np.dtype(dtype)
        self.n = int(r.size)
        self._stop = np.uint64(stop)
        self._real = kernels.ctype(self.dtype)
        self._outer = (("outer_t", kernels.ctype(r.dtype)),)
        self._pointwise = kernels.module("precond_pointwise", real=self._real, defines=self._outer)
        self._last_writes_output = None  # (launches then, the step's arguments) of a retargetable Chebyshev step
        self._capacity = {}
        self._launches, self.labels, self._label = [], [], ""
        self._uploads = {}   # id of a host or device object -> (the object, its device copy)
        self._scratch = {}
        same = r.dtype == self.dtype
        if converted is not None and (same or converted.dtype != self.dtype or converted.size != self.n):
            raise ValueError("converted must be r in the program's precision, which differs from r's")
        self.input = r if same else converted if converted is not None else cupy.zeros(self.n, dtype=self.dtype)
        self.output = z if same else cupy.zeros(self.n, dtype=self.dtype)
        self._z = None if same else z
        if not same and converted is None:
            self._add(self._pointwise, "to_inner", self.n, np.int32(self.n), r, self.input)

    # -- what the sequence works on -------------------------------------------

    def _upload(self, obj, make):
        key = id(obj)
        if key not in self._uploads:  # the object is kept alongside, so its id is never reused
            self._uploads[key] = (obj, make(obj))
        return self._uploads[key][1]

    def matrix(self, M):
        """``M`` (SciPy or cupyx sparse, or dense) laid out on the device, on first use (:func:`layout_for`)."""
        given = self._laid_out
        layout = given[1] if given is not None and given[0] is M else None
        return self._upload(M, lambda m: DeviceMatrix(m, self.dtype, self.n, layout))

    def vector(self, v):
        """``v`` (NumPy or CuPy) on the device in the program's precision, uploaded on first use."""
        return self._upload(v, lambda a: self.cupy.ascontiguousarray(self.cupy.asarray(a), dtype=self.dtype))

    def scratch(self, owner, name, n):
        """A work vector of ``n`` entries that belongs to ``owner`` (the same one at every call)."""
        key = (id(owner), name)
        if key not in self._scratch:
            self._scratch[key] = (owner, self.cupy.zeros(n, dtype=self.dtype))
        return self._scratch[key][1]

    @contextlib.contextmanager
    def section(self, label):
        """Label the launches appended inside the ``with`` block (what :attr:`labels` records)."""
        outer, self._label = self._label, label
        try:
            yield
        finally:
            self._label = outer

    # -- the launches -----------------------------------------------------------
    def _products(self, M):
        """``precond.cu`` compiled for the format of ``M`` (a :class:`DeviceMatrix`)."""
        fmt = M.format
        return kernels.module("precond", real=self._real, defines=tuple(fmt.defines) + self._outer,
                              before=("matrix", *fmt.kernel_files), structs=(fmt.struct,))

    def _add(self, module, name, work, *args):
        """Append a launch of ``name`` over ``work`` items (threads): enough blocks to fill the GPU, no more."""
        kernel = module.get_function(name)
        key = (id(module), name)
        if key not in self._capacity:  # grid-stride kernels: no second wave
            self._capacity[key] = (module, kernels.resident_blocks(kernel, BLOCK))
        grid = int(max(1, min(-(-work // BLOCK), self._capacity[key][1])))
        self._launches.append((kernel, grid, args + (self._stop,)))
        self.labels.append(self._label)

    def axpby(self, M, v, y, out, a=1.0, c=1.0):
        """``out = a M v + c y`` (``y`` None: ``a M v``); ``M`` from :meth:`matrix`. ``out`` may be ``y``."""
        real = self.dtype.type
        self._add(self._products(M), "axpby", M.work, M.struct, v, np.uint64(0) if y is None else y, out, real(a),
                  real(c))

    def chebyshev_begin(self, b, dinv, first, x, d, rs):
        """``rs = D^-1 b``, ``d = first rs``, ``x = d``."""
        self._add(self._pointwise, "chebyshev_begin", x.size, np.int32(x.size), b, dinv, self.dtype.type(first), x,
                  d, rs)

    def chebyshev_residual(self, A, x, b, dinv, first, d, rs, x_out=None):
        """``rs = D^-1 (b - A x)``, ``d = first rs`` (and ``x_out = x + d``; ``x_out`` is not ``x``)."""
        self._add(self._products(A), "chebyshev_residual", A.work, A.struct, x, b, dinv, self.dtype.type(first), d,
                  rs, np.uint64(0) if x_out is None else x_out)

    def chebyshev_start_step(self, A, b, dinv, first, d_new, rs, x, c1, c2):
        """:meth:`chebyshev_begin` and the first :meth:`chebyshev_step` in one launch: ``d_0 = first D^-1 b``
        formed where the product reads it, ``rs = D^-1 b - D^-1 A d_0``, ``d_new = c1 d_0 + c2 rs``,
        ``x = d_0 + d_new``."""
        real = self.dtype.type
        self._add(self._products(A), "chebyshev_start_step", A.work, A.struct, b, dinv, real(first), d_new, rs, x,
                  real(c1), real(c2))

    def chebyshev_step(self, A, dinv, d_old, d_new, rs, x_in, x_out, c1, c2, add_old=False):
        """``rs -= D^-1 A d_old``, ``d_new = c1 d_old + c2 rs``, ``x_out = x_in (+ d_old) + d_new``."""
        step = (A, dinv, d_old, d_new, rs, x_in, c1, c2, add_old)
        self._chebyshev_step("chebyshev_step", x_out, *step)
        if x_out is self.output and self._z is not None:  # close() may have it write z instead
            self._last_writes_output = (len(self._launches), step)

    def _chebyshev_step(self, name, out, A, dinv, d_old, d_new, rs, x_in, c1, c2, add_old):
        real = self.dtype.type
        self._add(self._products(A), name, A.work, A.struct, dinv, d_old, d_new, rs, x_in, out, real(c1), real(c2),
                  np.int32(add_old))

    def jacobi_sweep(self, A, y, b, s, out):
        """``out = y + s (b - A y)`` (``out`` is not ``y``)."""
        self._add(self._products(A), "jacobi_sweep", A.work, A.struct, y, b, s, out)

    def scaled_add(self, s, v, x, accumulate):
        """``x = s v`` (``x += s v`` when ``accumulate``), entry by entry."""
        self._add(self._pointwise, "scaled_add", x.size, np.int32(x.size), s, v, x, np.int32(accumulate))

    def close(self):
        """End the sequence: ``z`` from :attr:`output` when the precisions differ.

        When the last launch is a Chebyshev step writing :attr:`output`, it writes ``z``
        itself instead (``chebyshev_step_to_outer``: the same values, converted), so no
        conversion launch follows and :attr:`output` keeps the previous step's values.
        """
        if self._z is not None:
            last = self._last_writes_output
            if last is not None and last[0] == len(self._launches):
                self._launches.pop()
                with self.section(self.labels.pop()):
                    self._chebyshev_step("chebyshev_step_to_outer", self._z, *last[1])
            else:
                self._add(self._pointwise, "to_outer", self.n, np.int32(self.n), self.output, self._z)
            self._z = None
        return self

    def launch(self, stream=None, first=0, stop=None):
        """Enqueue the whole sequence on ``stream`` (or launches ``first`` to ``stop``, for timings)."""
        for kernel, grid, args in self._launches[first:stop]:
            kernel((grid,), (BLOCK,), args, stream=stream)

    @property
    def launches(self):
        """Kernel launches an application takes."""
        return len(self._launches)
