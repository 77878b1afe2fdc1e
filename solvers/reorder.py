"""Bandwidth-reducing reordering of a symmetric matrix, hidden from the caller.

A :class:`Reordering` is a symmetric permutation ``P A P^T`` applied once at
set-up; right-hand sides and initial guesses are permuted on the way in and
solutions permuted back on the way out, so callers never see it. Two orders
bring each row's neighbours close in memory, so the product's gathers share
cache lines: reverse Cuthill-McKee, on the GPU our own
(:mod:`solvers.cuthill_mckee`, milliseconds for millions of rows), on the CPU
SciPy's (``scipy.sparse.csgraph``; the two break ties differently, so their
orders differ; both are deterministic), and the neighbours' order that SELL lays
its rows out in (:func:`solvers.formats.sell.neighbours_order`: a few sorts, the
same order on the GPU and in NumPy).

:func:`gather_sectors` measures how scattered a product's reads are; the PCG
solver's ``reorder="auto"`` decides from it (see :func:`choose_reordering`),
and defers the neighbours' renumbering until the solves have run long enough for
it to pay (:class:`DeferredReordering`).
"""
import math
import time

import numpy as np
import scipy.sparse as sp

from .backend import array_module, is_cupy_sparse
from .cuthill_mckee import SORT_ON_DEVICE, cuthill_mckee, program, segments
from .errors import InputError
from .formats.base import increasing_rows, window_sectors

REORDERINGS = ("auto", "none", "rcm", "neighbours")
#: Passes of SELL's neighbours' order (:func:`solvers.formats.sell.neighbours_order`, then sorted by length
#: within SELL's windows, as the format lays its rows out) that ``reorder="neighbours"`` takes. H200,
#: random geometric graph of 2M rows, PCG us an iteration as numbered / after two passes / four / our
#: reverse Cuthill-McKee: 280.3 / 195.8 / 184.2 / 208.6,
#: the ordering 2.6 / 3.5 / 9.5 ms; 500k rows 58.7 / 49.8 / 46.5 / 46.1, 1.2 / 1.4 / 4.6 ms
#: (scripts/results/probe_row_orders_2026-12-01_0216_NVIDIA_H200_905c59c.md).
NEIGHBOUR_PASSES = 4
#: 32-byte memory sectors a warp's gathers touch per nonzero above which a matrix counts as scattered.
SCATTERED = 0.4
#: Longest row ``auto`` reorders. No numbering brings a hub's columns together (a row of k entries
#: spans at least k - 1 columns, so its reads stay scattered), and a hub, everyone's neighbour, leaves
#: little locality to find.
AUTO_MAX_ROW_LENGTH = 1024
# The cost model of ``auto``, H200 (scripts/probe_reorder.py; MEASUREMENTS.md). The neighbours'
# renumbering costs GPU_SECONDS_NEIGHBOURS and GPU_SECONDS_NEIGHBOURS_PER_NONZERO a stored entry (1.4
# and 3.5 ms for the random geometric graphs of 500k and 2M rows, 7.4M and 29.6M nonzeros:
# scripts/results/probe_row_orders_2026-12-01_0216_NVIDIA_H200_905c59c.md); permuting A
# GPU_SECONDS_PER_NONZERO a stored entry (1.2 ms for 29.6M); counting the sectors the reordered
# matrix reads, with the launches around it, GPU_SECONDS_FIXED (auto's whole reordering took 3.3 and
# 3.1 ms more than the ordering and the permutation at 500k and 2M rows,
# scripts/results/probe_reorder_2026-11-30_1955_NVIDIA_H200_448832d.md). A sector of gathered reads
# saved saves SECONDS_PER_SECTOR_FROM_MEMORY an iteration where an iteration's vectors do not fit in
# the L2 cache together, and SECONDS_PER_SECTOR_FROM_CACHE where they do, counting down to
# SECTORS_AFTER: fitted to reverse Cuthill-McKee (2M rows: 283.5 us at 0.95 sectors a nonzero, 212.3
# us at 0.16; 500k rows: 58.1 and 51.0 us; 50k rows: 12.6 and 11.7 us, 1.6 ps a sector), which the
# neighbours' renumbering beats (2M rows 184.2 us, 500k 46.5 us): the model under-predicts its
# saving, and plans it later than it could. A reordering that falls due mid-way also sets the solver
# up again on the reordered matrix (format, diagonal, kernels, the graph's capture):
# GPU_SECONDS_SET_UP_AGAIN and GPU_SECONDS_SET_UP_AGAIN_PER_NONZERO (3.9 and 6.1 ms at 500k and 2M
# rows, warm; scripts/results/probe_reorder_deferred_2026-11-30_2223_NVIDIA_H200_ffaa1b2.md).
GPU_SECONDS_NEIGHBOURS = 0.7e-3
GPU_SECONDS_NEIGHBOURS_PER_NONZERO = 0.095e-9
GPU_SECONDS_PER_NONZERO = 0.05e-9
GPU_SECONDS_FIXED = 3.5e-3
GPU_SECONDS_SET_UP_AGAIN = 3.2e-3
GPU_SECONDS_SET_UP_AGAIN_PER_NONZERO = 0.1e-9
SECONDS_PER_SECTOR_FROM_MEMORY = 3.0e-12
SECONDS_PER_SECTOR_FROM_CACHE = 1.2e-12
SECTORS_AFTER = 0.16
#: Vectors of n float64 entries an iteration streams besides gathering one (x, r, z, p, q, the
#: inverse diagonal).
ITERATION_VECTORS = 6


def gather_sectors(indptr, indices, rows_per_warp=32, itemsize=8, samples=2048, reordering=None):
    """Distinct 32-byte sectors of the multiplied vector that a warp's rows read, per nonzero.

    The rows are taken ``rows_per_warp`` at a time, in storage order, as one warp
    of the product kernels reads them; ``samples`` such groups, evenly spaced, are
    counted (all of them for smaller matrices). About 1 for random numbering (each
    gather a memory transaction of its own), well below 1 for banded matrices.
    Counted where the arrays are (NumPy, or CuPy for a matrix on the GPU); with a
    :class:`Reordering`, for ``P A P^T`` (without forming it).
    """
    xp = array_module(indptr)
    n = int(indptr.size) - 1
    if reordering is None:
        return window_sectors(indptr, indices, xp.arange(n), rows_per_warp, xp, samples, itemsize)
    return window_sectors(indptr, indices, reordering.like("perm", indptr), rows_per_warp, xp, samples, itemsize,
                          renumber=reordering.like("inverse", indptr))


class Reordering:
    """A symmetric permutation: row (and column) ``i`` of the reordered matrix is ``perm[i]`` of the original.

    Parameters
    ----------
    perm : ndarray of int (NumPy or CuPy)
        A permutation of ``range(n)``.
    name : str
        What produced it (for reports).
    seconds : float
        Time it took to compute and apply (set by :func:`choose_reordering`).
    inverse : ndarray of int, optional
        ``perm``'s inverse, where it is known already (of ``perm``'s type and module).

    Attributes
    ----------
    levels, passes : int or None
        Breadth-first levels and passes the GPU's Cuthill-McKee took (None for SciPy's).
    """

    def __init__(self, perm, name, seconds=0.0, inverse=None):
        xp = array_module(perm)
        self.perm = xp.ascontiguousarray(perm, dtype=np.int64 if xp is np else xp.int32)
        if inverse is None:
            inverse = xp.empty_like(self.perm)
            inverse[self.perm] = xp.arange(self.perm.size, dtype=self.perm.dtype)
        self.inverse = xp.ascontiguousarray(inverse, dtype=self.perm.dtype)
        self.name = name
        self.seconds = seconds
        self.levels = self.passes = None
        self._copies = {}

    def like(self, which, array):
        """``perm`` or ``inverse`` where ``array`` is (a host or device copy, made once)."""
        own = getattr(self, which)
        xp = array_module(array)
        if array_module(own) is xp:
            return own
        if which not in self._copies:
            self._copies[which] = own.get() if xp is np else xp.asarray(own)
        return self._copies[which]

    def matrix(self, A):
        """``P A P^T`` of a SciPy or cupyx sparse matrix, as CSR with sorted indices, where A lives."""
        t0 = time.perf_counter()
        if is_cupy_sparse(A):
            import cupy
            out = _permuted_on_device(canonical(A), self.like("perm", A.indptr),
                                      self.like("inverse", A.indptr))
            cupy.cuda.Device().synchronize()
        else:
            coo = sp.coo_matrix(A)
            inverse = self.like("inverse", coo.row)
            out = sp.csr_matrix((coo.data, (inverse[coo.row], inverse[coo.col])), shape=A.shape)
            out.sort_indices()
        self.seconds += time.perf_counter() - t0
        return out

    def forward(self, v):
        """``P v``: a vector in the original numbering, in the reordered one (NumPy or CuPy)."""
        return v[self.like("perm", v)]

    def backward(self, v):
        """``P^T v``: a vector in the reordered numbering, back in the original one."""
        return v[self.like("inverse", v)]


def canonical(A):
    """A SciPy or cupyx CSR matrix with sorted column indices and no duplicates (a copy when ``A`` is not).

    A cupyx matrix is checked entry by entry (:func:`~.formats.base.increasing_rows`) and marked, so that
    cupyx's own check, a thread a row, never walks a long row alone; one that is not canonical is made so by
    SciPy on the host (duplicates summed in their stored order, the same bits whatever the device)."""
    A = A.tocsr()
    if is_cupy_sparse(A):
        import cupy
        import cupyx.scipy.sparse as csp
        A.has_canonical_format = increasing_rows(A.indptr, A.indices[:A.nnz], cupy)
        return A if A.has_canonical_format else csp.csr_matrix(canonical(A.get()))
    if not A.has_canonical_format:
        A = A.copy()
        A.sum_duplicates()
    return A


def _permuted_on_device(A, perm, inverse):
    """``P A P^T`` of a canonical cupyx CSR matrix: rows gathered, columns renumbered and sorted (``permute_rows``)."""
    import cupy
    import cupyx.scipy.sparse as csp

    from . import kernels
    n, nnz = A.shape[0], int(A.nnz)
    if nnz == 0:
        return csp.csr_matrix(A.shape, dtype=A.dtype)
    if nnz >= 2**31 - 1:
        raise InputError("matrices with 2^31 or more entries are not supported (int32 indices)")
    indptr = A.indptr.astype(cupy.int32, copy=False)
    lengths = cupy.diff(indptr)[perm]
    new_indptr = cupy.zeros(n + 1, dtype=cupy.int32)
    new_indptr[1:] = cupy.cumsum(lengths)
    new_indices = cupy.empty(nnz, dtype=cupy.int32)
    source = cupy.empty(nnz, dtype=cupy.int32)
    kernel = kernels.module(**program()).get_function("permute_rows")
    blocks = min(-(-n // 8), 65535)  # a warp a row
    kernel((blocks,), (256,), (np.int32(n), perm, inverse, indptr, A.indices.astype(cupy.int32, copy=False),
                               new_indptr, new_indices, source))
    long_rows = cupy.flatnonzero(lengths > SORT_ON_DEVICE)
    if long_rows.size:  # the kernel left them in the original order
        row, positions = segments(new_indptr[long_rows], lengths[long_rows], cupy)
        ordering = cupy.lexsort(cupy.stack((new_indices[positions], row)))
        new_indices[positions] = new_indices[positions][ordering]
        source[positions] = source[positions][ordering]
    out = csp.csr_matrix((A.data[source], new_indices, new_indptr), shape=A.shape)
    out.has_canonical_format = True
    return out


def choose_reordering(A, requested, device):
    """The reordering of ``A`` (SciPy or cupyx CSR) that ``requested`` asks for, with why, or None.

    ``rcm`` is reverse Cuthill-McKee: on the GPU for ``device="gpu"`` (a host
    matrix is uploaded first; :func:`solvers.cuthill_mckee.cuthill_mckee`), SciPy's
    on the host otherwise. ``neighbours`` renumbers by :data:`NEIGHBOUR_PASSES`
    passes of SELL's neighbours' order (:func:`solvers.formats.sell.neighbours_order`:
    rows sharing a neighbour together, a few sorts), on the GPU for ``device="gpu"``,
    in NumPy otherwise (the same order). ``auto`` plans a reordering on the GPU only,
    as :func:`auto_reordering` decides.

    Returns
    -------
    (Reordering, DeferredReordering or None, str)
        The reordering (or, for ``auto``, the plan), and a note for the report (why, or why not).
    """
    if requested not in REORDERINGS:
        raise InputError(f"reorder must be one of {', '.join(REORDERINGS)}, not {requested!r}")
    if requested == "none":
        return None, "none"
    if not (sp.issparse(A) or is_cupy_sparse(A)):
        if requested != "auto":
            raise InputError(f"reorder={requested!r} needs an explicit sparse matrix")
        return None, "none (not a sparse matrix)"
    if requested == "neighbours":
        if device == "gpu":
            import cupyx.scipy.sparse as csp
            A = A if is_cupy_sparse(A) else csp.csr_matrix(sp.csr_matrix(A))
        return _neighbours(canonical(A)), "neighbours"
    if device != "gpu":
        if requested == "auto":
            return None, "none (auto reorders on the GPU only)"
        return _scipy_rcm(A), "rcm"
    import cupyx.scipy.sparse as csp

    from . import kernels

    A = canonical(A if is_cupy_sparse(A) else csp.csr_matrix(sp.csr_matrix(A)))
    if requested == "rcm":
        return _cuthill_mckee_reversed(A), "rcm"
    return auto_reordering(A, int(kernels.device_attribute("L2CacheSize")))


def auto_reordering(A, cache_bytes):
    """What ``reorder="auto"`` plans for a canonical CSR matrix: ``(DeferredReordering or None, note)``.

    Measured where ``A`` is (cupyx: on the GPU; SciPy: with the NumPy reference,
    the same decisions), for a GPU with an L2 cache of ``cache_bytes``. A matrix
    whose product reads are scattered (:func:`gather_sectors` above
    :data:`SCATTERED`), with no row longer than :data:`AUTO_MAX_ROW_LENGTH`, gets a
    :class:`DeferredReordering`: the solver runs it as numbered until the
    neighbours' renumbering would have paid for itself, then reorders. Nothing is
    ordered here, since the iteration count that decides is not known at set-up.
    """
    xp = array_module(A.indptr)
    n = A.shape[0]
    longest = int(xp.diff(A.indptr).max()) if n else 0
    scattered = gather_sectors(A.indptr, A.indices)
    if scattered <= SCATTERED:
        return None, f"none (local reads: {scattered:.2f} sectors a nonzero)"
    if longest > AUTO_MAX_ROW_LENGTH:
        return None, f"none (scattered reads, but a row of {longest:,} entries stays scattered in any order)"
    from_memory = n * 8 * ITERATION_VECTORS > cache_bytes
    per_sector = SECONDS_PER_SECTOR_FROM_MEMORY if from_memory else SECONDS_PER_SECTOR_FROM_CACHE
    plan = DeferredReordering(A, scattered, per_sector)
    return plan, plan.note


class DeferredReordering:
    """The neighbours' renumbering held back until the solves have run long enough for it to pay.

    The iterations a solve will take are unknown at set-up, so the decision is
    made as they run, the way one decides to buy rather than rent: the solver
    iterates as numbered until the time the reordering would have saved (the
    model's saving an iteration, times the iterations run, over all solves) reaches
    its predicted cost, :attr:`iterations` iterations, and reorders then. A solve
    that stops sooner never pays for an ordering; one that runs on loses at most
    the ordering's cost against knowing its count in advance. A solve it falls
    due in reorders there only if, at its rate so far, it has as many iterations
    again to go (:meth:`pays_within`); otherwise the reordering waits for the start
    of the solver's next solve.

    Parameters
    ----------
    A : CSR matrix (SciPy or cupyx), canonical
        The matrix to order, kept until then (where the solve runs).
    scattered : float
        Sectors a nonzero its product reads as numbered.
    per_sector : float
        Seconds an iteration spends a sector a nonzero (from memory or from the cache).

    Attributes
    ----------
    saving, cost : float
        Predicted seconds saved an iteration, and seconds the reordering costs.
    iterations : int
        The pay-off count: iterations as numbered after which it reorders.
    left : int
        Iterations still to run as numbered.
    """

    def __init__(self, A, scattered, per_sector):
        nnz = int(A.nnz)
        self.A, self.scattered, self.per_sector = A, scattered, per_sector
        self.saving = per_sector * max(scattered - SECTORS_AFTER, 0.0) * nnz
        # the ordering, counting sectors, permuting A, the solver set up again
        self.cost = (GPU_SECONDS_NEIGHBOURS + GPU_SECONDS_FIXED + GPU_SECONDS_SET_UP_AGAIN
                     + (GPU_SECONDS_NEIGHBOURS_PER_NONZERO + GPU_SECONDS_PER_NONZERO
                        + GPU_SECONDS_SET_UP_AGAIN_PER_NONZERO) * nnz)
        self.iterations = max(1, math.ceil(self.cost / self.saving))  # scattered > SCATTERED > SECTORS_AFTER
        self.left = self.iterations

    @property
    def note(self):
        """What is planned, for the report."""
        return (f"neighbours after {self.iterations:,} iterations as numbered ({self.scattered:.2f} sectors a "
                f"nonzero; predicted to cost {self.cost * 1e3:.1f} ms and save {self.saving * 1e6:.1f} us an "
                "iteration)")

    def ran(self, iterations):
        """Count iterations run as numbered; True once the reordering is due."""
        self.left = max(self.left - iterations, 0)
        return self.left == 0

    def pays_within(self, initial, current, iterations, tol):
        """Whether a solve that has brought its residual norm from ``initial`` to ``current`` in
        ``iterations`` is predicted to run :attr:`iterations` more to reach ``tol``, at the rate so far
        (so that reordering now pays within it)."""
        if current <= tol:
            return False
        if not (0 < current < initial) or iterations == 0:
            return True  # no progress yet: a long way to go
        rate = math.log(current / initial) / iterations  # log of the mean reduction an iteration, < 0
        return math.log(tol / current) / rate >= self.iterations

    def order(self):
        """Order now: ``(Reordering or None, note)``, None where the order's locality disappoints: the
        sectors counted on the reordered pattern must save more than permuting ``A`` costs over another
        :attr:`iterations` iterations."""
        nnz = int(self.A.nnz)
        order = _neighbours(self.A)
        t0 = time.perf_counter()
        after = gather_sectors(self.A.indptr, self.A.indices, reordering=order)
        order.seconds += time.perf_counter() - t0
        if self.per_sector * (self.scattered - after) * nnz * self.iterations <= GPU_SECONDS_PER_NONZERO * nnz:
            return None, (f"none (the neighbours' order found little locality: {self.scattered:.2f} -> "
                          f"{after:.2f} sectors a nonzero, too little to pay for permuting A)")
        return order, (f"neighbours after {self.iterations:,} iterations ({self.scattered:.2f} -> {after:.2f} "
                       "sectors a nonzero)")


def _neighbours(A):
    """The renumbering of a canonical square CSR matrix by SELL's neighbours' order, where it is, timed."""
    from .formats.sell import SELL, neighbours_order
    if A.shape[0] != A.shape[1]:
        raise InputError(f"reorder='neighbours' needs a square matrix, got shape {A.shape}")
    xp = array_module(A.indptr)
    t0 = time.perf_counter()
    indptr, indices = (xp.ascontiguousarray(a, dtype=xp.int32) for a in (A.indptr, A.indices))
    order = Reordering(neighbours_order(indptr, indices, xp, NEIGHBOUR_PASSES, SELL.LONG_ROW, SELL.NEIGHBOUR_WINDOW),
                       "neighbours")
    if xp is not np:
        xp.cuda.Device().synchronize()
    order.seconds = time.perf_counter() - t0  # the permutation of A adds its time (Reordering.matrix)
    return order


def _scipy_rcm(A):
    """SciPy's reverse Cuthill-McKee of a host (or device) matrix, timed."""
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    t0 = time.perf_counter()
    host = A.get() if is_cupy_sparse(A) else sp.csr_matrix(A)
    order = Reordering(reverse_cuthill_mckee(host, symmetric_mode=True), "rcm")
    order.seconds = time.perf_counter() - t0  # the permutation of A adds its time (Reordering.matrix)
    return order


def _cuthill_mckee_reversed(A):
    """Our reverse Cuthill-McKee of a canonical CSR matrix where it is, timed."""
    xp = array_module(A.indptr)
    t0 = time.perf_counter()
    ordering = cuthill_mckee(A.indptr, A.indices)
    order = Reordering(ordering.order[::-1], "rcm")
    order.levels, order.passes = ordering.levels, ordering.passes
    if xp is not np:
        xp.cuda.Device().synchronize()
    order.seconds = time.perf_counter() - t0  # the permutation of A adds its time (Reordering.matrix)
    return order
