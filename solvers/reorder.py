"""Bandwidth-reducing reordering of a symmetric matrix, hidden from the caller.

A :class:`Reordering` is a symmetric permutation ``P A P^T`` applied once at
set-up; right-hand sides and initial guesses are permuted on the way in and
solutions permuted back on the way out, so callers never see it. Reverse
Cuthill-McKee (``scipy.sparse.csgraph``) brings each row's neighbours close in
memory, so the product's gathers share cache lines.

:func:`gather_sectors` measures how scattered a product's reads are; the PCG
solver's ``reorder="auto"`` decides from it (see :func:`choose_reordering`).
"""
import time

import numpy as np
import scipy.sparse as sp

from .backend import array_module, is_cupy_sparse
from .errors import InputError
from .formats.base import window_sectors

REORDERINGS = ("auto", "none", "rcm")
#: 32-byte memory sectors a warp's gathers touch per nonzero above which a matrix counts as scattered.
SCATTERED = 0.4
#: Longest row ``auto`` reorders: Cuthill-McKee orders each vertex's neighbours by degree, which on
#: a graph with a hub row costs minutes (126 s for a 1M-row power-law graph).
AUTO_MAX_ROW_LENGTH = 1024
# The cost model of ``auto`` (H200 and its host, scripts/probe_formats.py, MEASUREMENTS.md): SciPy's
# reverse Cuthill-McKee takes about 34 ns a nonzero (1.0 s for a 2M-row random geometric graph,
# 29.6M nonzeros); a sector of gathered reads saved saves about 4.7 ps an iteration (that graph: 324
# us an iteration at 0.95 sectors a nonzero, 213 us after RCM at 0.16).
RCM_SECONDS_PER_NONZERO = 34e-9
SECONDS_PER_SECTOR = 4.7e-12
SECTORS_AFTER_RCM = 0.16
#: Iterations the reordering must pay for itself within: the solve's own count is unknown at set-up.
AUTO_ITERATIONS = 1000


def gather_sectors(indptr, indices, rows_per_warp=32, itemsize=8, samples=2048):
    """Distinct 32-byte sectors of the multiplied vector that a warp's rows read, per nonzero.

    The rows are taken ``rows_per_warp`` at a time, in storage order, as one warp
    of the product kernels reads them; ``samples`` such groups, evenly spaced, are
    counted (all of them for smaller matrices). About 1 for random numbering (each
    gather a memory transaction of its own), well below 1 for banded matrices.
    Counted where the arrays are (NumPy, or CuPy for a matrix on the GPU).
    """
    xp = array_module(indptr)
    n = int(indptr.size) - 1
    return window_sectors(indptr, indices, xp.arange(n), rows_per_warp, xp, samples, itemsize)


class Reordering:
    """A symmetric permutation: row (and column) ``i`` of the reordered matrix is ``perm[i]`` of the original.

    Parameters
    ----------
    perm : ndarray of int
        A permutation of ``range(n)``.
    name : str
        What produced it (for reports).
    seconds : float
        Time it took to compute and apply (set by :func:`choose_reordering`).
    """

    def __init__(self, perm, name, seconds=0.0):
        self.perm = np.asarray(perm, dtype=np.int64)
        self.inverse = np.empty_like(self.perm)
        self.inverse[self.perm] = np.arange(self.perm.size)
        self.name = name
        self.seconds = seconds
        self._device = {}

    def matrix(self, A):
        """``P A P^T`` of a SciPy or cupyx sparse matrix, as CSR with sorted indices, where A lives."""
        t0 = time.perf_counter()
        if is_cupy_sparse(A):
            import cupyx.scipy.sparse as csp
            coo = A.tocoo()
            inverse = self._index("inverse", coo.row)
            out = csp.coo_matrix((coo.data, (inverse[coo.row], inverse[coo.col])), shape=A.shape).tocsr()
        else:
            coo = sp.coo_matrix(A)
            out = sp.csr_matrix((coo.data, (self.inverse[coo.row], self.inverse[coo.col])), shape=A.shape)
        out.sort_indices()
        self.seconds += time.perf_counter() - t0
        return out

    def _index(self, which, like):
        if isinstance(like, np.ndarray):
            return getattr(self, which)
        key = (which, id(type(like)))
        if key not in self._device:
            import cupy
            self._device[key] = cupy.asarray(getattr(self, which))
        return self._device[key]

    def forward(self, v):
        """``P v``: a vector in the original numbering, in the reordered one (NumPy or CuPy)."""
        return v[self._index("perm", v)]

    def backward(self, v):
        """``P^T v``: a vector in the reordered numbering, back in the original one."""
        return v[self._index("inverse", v)]


def choose_reordering(A, requested, device):
    """The reordering of ``A`` (SciPy or cupyx CSR) that ``requested`` asks for, with why, or None.

    ``auto`` reorders on the GPU only, a matrix whose product reads are scattered
    (:func:`gather_sectors` above :data:`SCATTERED`), with no row longer than
    :data:`AUTO_MAX_ROW_LENGTH`, and only when the model above predicts that the
    reordering costs less than it saves over :data:`AUTO_ITERATIONS` iterations.
    The measurements run where ``A`` is (a GPU solve uploads a host matrix first,
    so they read it there); reverse Cuthill-McKee itself runs on the host (SciPy).

    Returns
    -------
    (Reordering or None, str)
        The reordering, and a note for the report (why, or why not).
    """
    if requested not in REORDERINGS:
        raise InputError(f"reorder must be one of {', '.join(REORDERINGS)}, not {requested!r}")
    if requested == "none":
        return None, "none"
    if not (sp.issparse(A) or is_cupy_sparse(A)):
        if requested == "rcm":
            raise InputError("reorder='rcm' needs an explicit sparse matrix")
        return None, "none (not a sparse matrix)"
    A = A.tocsr() if is_cupy_sparse(A) else sp.csr_matrix(A)
    if requested == "auto":
        if device != "gpu":
            return None, "none (auto reorders on the GPU only)"
        longest = int(array_module(A.indptr).diff(A.indptr).max()) if A.shape[0] else 0
        scattered = gather_sectors(A.indptr, A.indices)
        if scattered <= SCATTERED:
            return None, f"none (local reads: {scattered:.2f} sectors a nonzero)"
        if longest > AUTO_MAX_ROW_LENGTH:
            return None, f"none (scattered reads, but a row of {longest:,} entries makes RCM slow)"
        cost = RCM_SECONDS_PER_NONZERO * A.nnz
        saving = SECONDS_PER_SECTOR * max(scattered - SECTORS_AFTER_RCM, 0.0) * A.nnz
        if cost > saving * AUTO_ITERATIONS:
            return None, (f"none (scattered reads, {scattered:.2f} sectors a nonzero, but RCM would pay for "
                          f"itself only after about {cost / saving:,.0f} iterations)")
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    t0 = time.perf_counter()
    order = Reordering(reverse_cuthill_mckee(A.get() if is_cupy_sparse(A) else A, symmetric_mode=True), "rcm")
    order.seconds = time.perf_counter() - t0  # the permutation of A adds its time (Reordering.matrix)
    return order, "rcm"
