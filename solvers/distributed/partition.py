"""Row-block partition of a sparse matrix over MPI ranks.

Rank ``q`` owns the contiguous rows ``bounds[q]:bounds[q+1]``, chosen so that
every rank holds about the same number of nonzeros. Its columns are renumbered:
the ones it owns from 0, then the others (the *halo*) in a compact buffer
ordered by owner. The CPU path keeps the two parts as separate blocks (the
local product runs while the halo travels); the GPU path multiplies whole rows
of the *extended* block, against vectors that carry the halo at their tail. The :class:`HaloPlan` saying which entries travel
between which ranks is built once, at set-up.
"""
import dataclasses

import numpy as np
import scipy.sparse as sp

from ..errors import InputError


def nnz_bounds(row_nnz, first_row, n, parts, comm=None):
    """Row bounds of ``parts`` contiguous blocks with balanced nonzeros.

    Parameters
    ----------
    row_nnz : ndarray of int
        Nonzeros of rows ``first_row .. first_row + len(row_nnz) - 1``. With
        ``comm`` every rank passes its own slice (slices in rank order,
        covering all ``n`` rows); without it, all rows.
    first_row, n : int
        Where the slice starts; number of rows in total.
    parts : int
        Number of blocks.
    comm : mpi4py communicator, optional

    Returns
    -------
    ndarray of int64, shape (parts + 1,)
        ``bounds[0] = 0``, ``bounds[-1] = n``; every block has at least one row.
    """
    if parts > n:
        raise InputError(f"{parts} ranks for a matrix of {n} rows: use at most {n} ranks")
    cum = np.cumsum(row_nnz, dtype=np.int64)
    offset, total = 0, int(cum[-1]) if cum.size else 0
    if comm is not None:
        offset = comm.exscan(total) or 0  # exscan gives None on rank 0
        total = comm.allreduce(total)
    targets = total * np.arange(1, parts, dtype=np.float64) / parts
    bounds = np.zeros(parts + 1, dtype=np.int64)
    # Block k starts after the first row whose running count reaches k/parts of the total;
    # exactly one slice contains that row.
    mine = (targets > offset) & (targets <= offset + (int(cum[-1]) if cum.size else 0))
    bounds[1:-1][mine] = first_row + 1 + np.searchsorted(cum + offset, targets[mine], side="left")
    if comm is not None:
        from mpi4py import MPI
        comm.Allreduce(MPI.IN_PLACE, bounds, op=MPI.MAX)
    bounds[-1] = n
    # Heavy rows can make targets share a row: keep every block non-empty.
    for k in range(1, parts):
        bounds[k] = max(bounds[k], bounds[k - 1] + 1)
    for k in range(parts - 1, 0, -1):
        bounds[k] = min(bounds[k], bounds[k + 1] - 1)
    return bounds


@dataclasses.dataclass
class HaloPlan:
    """Who sends what to whom in one halo exchange.

    Attributes
    ----------
    recv_ranks : list of int
        Ranks this one receives from, ascending.
    recv_offsets : ndarray
        Halo-buffer segment of each of ``recv_ranks`` (``len(recv_ranks) + 1`` offsets).
    send_ranks : list of int
        Ranks this one sends to, ascending.
    send_offsets : ndarray
        Segment of ``send_index`` for each of ``send_ranks``.
    send_index : ndarray of int
        Local row indices whose values are packed for sending, grouped by destination.
    """

    recv_ranks: list
    recv_offsets: np.ndarray
    send_ranks: list
    send_offsets: np.ndarray
    send_index: np.ndarray

    @property
    def halo_size(self):
        return int(self.recv_offsets[-1])

    @property
    def send_size(self):
        return int(self.send_index.size)


@dataclasses.dataclass
class LocalMatrix:
    """One rank's rows, split into local and halo columns.

    Attributes
    ----------
    lo, hi : int
        Global rows owned.
    local : scipy.sparse.csr_matrix
        ``(hi - lo) x (hi - lo)``: the columns this rank owns.
    halo : scipy.sparse.csr_matrix
        ``(len(boundary_rows)) x halo_size``: the other columns, only for the
        rows that have some (the *boundary* rows).
    boundary_rows : ndarray of int
        Local indices of rows with halo columns.
    halo_columns : ndarray of int
        Global column of each halo-buffer entry.
    plan : HaloPlan
    extended : scipy.sparse.csr_matrix
        ``(hi - lo) x (hi - lo + halo_size)``: whole rows, halo entry k as
        column ``hi - lo + k``, entries in the global column order (a row's
        products then add up in the order of the single-process solver).
    """

    lo: int
    hi: int
    local: sp.csr_matrix
    halo: sp.csr_matrix
    boundary_rows: np.ndarray
    halo_columns: np.ndarray
    plan: HaloPlan
    extended: sp.csr_matrix

    @property
    def rows(self):
        return self.hi - self.lo

    def diagonal(self):
        return np.asarray(self.local.diagonal())


def split_rows(rows, bounds, comm):
    """Split this rank's rows into local and halo parts and build the halo plan.

    Parameters
    ----------
    rows : scipy.sparse.csr_matrix
        Rows ``bounds[rank]:bounds[rank+1]`` of the global matrix, global
        column indices (shape ``(rows, n)``).
    bounds : ndarray
        Row bounds of every rank.
    comm : mpi4py communicator
        Collective: every rank calls it.

    Returns
    -------
    LocalMatrix
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    rows = sp.csr_matrix(rows)
    rows.sort_indices()
    cols = rows.indices.astype(np.int64)
    own = (cols >= lo) & (cols < hi)
    # Masking CSR entries keeps their row order: the new row pointers are running counts.
    own_before = np.concatenate([[0], np.cumsum(own)])[rows.indptr]
    halo_before = rows.indptr - own_before
    local = sp.csr_matrix((rows.data[own], cols[own] - lo, own_before), shape=(hi - lo, hi - lo))
    boundary_rows = np.flatnonzero(np.diff(halo_before))
    halo_columns, halo_pos = np.unique(cols[~own], return_inverse=True)
    halo_ptr = np.concatenate([halo_before[boundary_rows], halo_before[-1:]])
    halo = sp.csr_matrix((rows.data[~own], halo_pos.ravel(), halo_ptr),
                         shape=(boundary_rows.size, halo_columns.size))
    extended_cols = np.empty_like(cols)
    extended_cols[own] = cols[own] - lo
    extended_cols[~own] = hi - lo + halo_pos.ravel()
    extended = sp.csr_matrix((rows.data, extended_cols, rows.indptr), shape=(hi - lo, hi - lo + halo_columns.size))

    # Halo columns are sorted, so each owner's entries form one segment of the buffer.
    owners = np.searchsorted(bounds, halo_columns, side="right") - 1
    recv_counts = np.bincount(owners, minlength=size).astype(np.int64)
    send_counts = np.empty(size, dtype=np.int64)
    comm.Alltoall(recv_counts, send_counts)
    requested = np.empty(int(send_counts.sum()), dtype=np.int64)
    comm.Alltoallv([halo_columns.astype(np.int64), recv_counts], [requested, send_counts])
    plan = HaloPlan(
        recv_ranks=[int(r) for r in np.flatnonzero(recv_counts)],
        recv_offsets=np.concatenate([[0], np.cumsum(recv_counts[recv_counts > 0])]),
        send_ranks=[int(r) for r in np.flatnonzero(send_counts)],
        send_offsets=np.concatenate([[0], np.cumsum(send_counts[send_counts > 0])]),
        send_index=requested - lo,
    )
    return LocalMatrix(lo, hi, local, halo, boundary_rows, halo_columns, plan, extended)
