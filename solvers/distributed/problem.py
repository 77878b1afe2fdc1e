"""Distributed linear systems: read on rank 0 and scattered, or generated per rank.

The global matrix never sits on one rank: the reader holds the file's matrix
only on rank 0 (which parses it), and the Poisson generator builds each
rank's rows directly, so sizes beyond one node's memory work.
"""
import dataclasses

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from .comm import agree
from .partition import nnz_bounds


@dataclasses.dataclass
class DistProblem:
    """This rank's share of a system ``A x = b`` (what the CLI's report reads).

    Attributes
    ----------
    rows : scipy.sparse.csr_matrix
        Owned rows, global column indices, shape ``(hi - lo, n)``.
    bounds : ndarray
        Row bounds of every rank.
    b, x0, x_exact : ndarray or None
        Owned entries.
    """

    name: str
    n: int
    nnz: int
    rows: sp.csr_matrix
    bounds: np.ndarray
    b: np.ndarray
    comm: object
    x0: np.ndarray = None
    x_exact: np.ndarray = None

    def solution_error(self, x):
        """``||x - x_exact|| / ||x_exact||`` over all ranks (collective), or None."""
        if self.x_exact is None:
            return None
        x = x.get() if hasattr(x, "get") else np.asarray(x)
        sums = self.comm.allreduce(np.array([np.sum((x - self.x_exact) ** 2), np.sum(self.x_exact ** 2)]))
        return float(np.sqrt(sums[0] / sums[1]))


def _scatter_rows(comm, bounds, A):
    """Send rank ``q`` rows ``bounds[q]:bounds[q+1]`` of ``A`` (held by rank 0)."""
    rank = comm.Get_rank()
    if rank == 0:
        for q in range(1, comm.Get_size()):
            block = A[bounds[q]:bounds[q + 1]]
            comm.send((block.shape, block.nnz, block.data.dtype.str), dest=q, tag=11)
            for part in (block.indptr.astype(np.int64), block.indices.astype(np.int64), block.data):
                comm.Send(np.ascontiguousarray(part), dest=q, tag=12)
        return A[bounds[0]:bounds[1]]
    shape, nnz, dtype = comm.recv(source=0, tag=11)
    indptr, indices = np.empty(shape[0] + 1, np.int64), np.empty(nnz, np.int64)
    data = np.empty(nnz, np.dtype(dtype))
    for part in (indptr, indices, data):
        comm.Recv(part, source=0, tag=12)
    return sp.csr_matrix((data, indices, indptr), shape=shape)


def _scatter_vector(comm, bounds, v):
    """Rank 0's vector ``v`` (or None) split by ``bounds``; None everywhere when ``v`` is None."""
    if comm.bcast(v is None if comm.Get_rank() == 0 else None, root=0):
        return None
    rank = comm.Get_rank()
    counts = np.diff(bounds)
    out = np.empty(int(counts[rank]), dtype=np.float64)
    send = [np.asarray(v, dtype=np.float64), counts] if rank == 0 else None
    comm.Scatterv(send, out, root=0)
    return out


def read_distributed(comm, matrix, rhs=None, x0=None):
    """Read a system on rank 0, partition it by nonzeros and scatter the rows.

    Every rank raises the same :class:`~solvers.errors.InputError` when the
    files are bad, so all exit alike. Collective. Values stay float64: the
    solver rounds them to its precision (after scaling them into its range).
    """
    from ..pcg.problem import load_problem

    size = comm.Get_size()

    def read_and_split():
        if comm.Get_rank() != 0:
            return None, None
        p = load_problem(matrix, rhs, x0)
        if p.columns is not None:
            raise InputError(f"holds {p.columns} right-hand sides; across ranks one is solved at a time "
                             "(several are solved together on one GPU or the CPU)", rhs)
        return p, nnz_bounds(np.diff(p.A.indptr), 0, p.n, size)

    problem, bounds = agree(comm, read_and_split)
    name, n, nnz, bounds = comm.bcast(
        (problem.name, problem.n, problem.nnz, bounds) if problem is not None else None, root=0)
    rows = _scatter_rows(comm, bounds, problem.A if problem is not None else None)
    b, x0v, x_exact = (_scatter_vector(comm, bounds, getattr(problem, f, None)) for f in ("b", "x0", "x_exact"))
    return DistProblem(name, n, nnz, rows, bounds, b, comm, x0v, x_exact)


def _grid_coordinates(shape, first, count):
    """Coordinates (one row per axis) of the grid points ``first .. first + count - 1``."""
    return np.unravel_index(np.arange(first, first + count, dtype=np.int64), shape)


def _poisson_row_nnz(shape, first, count):
    coords = _grid_coordinates(shape, first, count)
    nnz = np.ones(count, dtype=np.int64)
    for c, m in zip(coords, shape):
        nnz += (c > 0).astype(np.int64) + (c < m - 1)
    return nnz


def poisson_rows(shape, lo, hi, dtype=np.float64):
    """Rows ``lo:hi`` of :func:`solvers.gallery.poisson` (``shape``), built without the rest.

    Returns
    -------
    scipy.sparse.csr_matrix
        Shape ``(hi - lo, prod(shape))``, sorted global column indices.
    """
    n = int(np.prod(shape))
    coords = _grid_coordinates(shape, lo, hi - lo)
    strides = [int(np.prod(shape[k + 1:])) for k in range(len(shape))]
    rows = np.arange(lo, hi, dtype=np.int64)
    # Columns in increasing order: -stride_0 .. -stride_last, diagonal, +stride_last .. +stride_0.
    offsets, valid = [], []
    for k in range(len(shape)):
        offsets.append(-strides[k])
        valid.append(coords[k] > 0)
    offsets.append(0)
    valid.append(np.ones(hi - lo, dtype=bool))
    for k in reversed(range(len(shape))):
        offsets.append(strides[k])
        valid.append(coords[k] < shape[k] - 1)
    mask = np.stack(valid, axis=1)
    cols = rows[:, None] + np.array(offsets, dtype=np.int64)[None, :]
    vals = np.where(np.array(offsets) == 0, 2.0 * len(shape), -1.0).astype(dtype)
    data = np.broadcast_to(vals, mask.shape)[mask]
    indptr = np.concatenate([[0], np.cumsum(mask.sum(axis=1), dtype=np.int64)])
    return sp.csr_matrix((data, cols[mask], indptr), shape=(hi - lo, n))


def poisson_distributed(comm, shape, dtype=np.float64):
    """Poisson system on ``shape``, each rank generating only its own rows; ``b = A @ ones``.

    Collective. The nonzero-balanced bounds come from each rank counting the
    nonzeros of an equal share of rows.
    """
    n = int(np.prod(shape))
    rank, size = comm.Get_rank(), comm.Get_size()
    first, last = n * rank // size, n * (rank + 1) // size
    bounds = agree(comm, lambda: nnz_bounds(_poisson_row_nnz(shape, first, last - first), first, n, size, comm))
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    rows = poisson_rows(shape, lo, hi, dtype)
    nnz = comm.allreduce(int(rows.nnz))
    b = np.asarray(rows.sum(axis=1)).ravel().astype(dtype)  # A @ ones needs only the owned rows
    name = "poisson" + "x".join(str(m) for m in shape)
    return DistProblem(name, n, nnz, rows, bounds, b, comm, None, np.ones(hi - lo, dtype=dtype))
