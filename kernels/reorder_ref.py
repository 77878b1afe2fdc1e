"""NumPy meaning of the kernels in ``reorder.cu`` (Cuthill-McKee levels, the symmetric permutation).

Each function takes and changes the same arrays as its kernel, with the same
integer results, so an ordering computed with these functions is the device's,
entry for entry.
"""
import numpy as np

#: ``parent`` of a vertex no position of the current level has claimed.
UNCLAIMED = 2**31 - 1
#: ``stamp`` of a vertex whose component is ordered (above every pass number).
PLACED = 2**31 - 1
#: How ``cm_levels`` ends: the pass is complete; it would exceed ``max_levels``; it placed a level
#: holding a group too large for one thread to sort (the host sorts it and resumes).
DONE, LIMIT, SORT = 0, 1, 2


def vertex_keys(degree, vertices):
    """``cm_key``: (degree, index) packed in 64 bits, so comparing keys compares the pairs."""
    vertices = np.asarray(vertices, dtype=np.int64)
    return (np.asarray(degree)[vertices].astype(np.int64) << 32) | vertices


def cm_degree(indptr, indices):
    """``cm_degree``: the entries of each row off the diagonal (int32)."""
    n = indptr.size - 1
    rows = np.repeat(np.arange(n), np.diff(indptr))
    return np.bincount(rows[indices[:rows.size] != rows], minlength=n).astype(np.int32)


def _entries(indptr, rows):
    """The CSR entries of ``rows``, row after row, and the position in ``rows`` each belongs to."""
    starts = indptr[rows].astype(np.int64)
    lengths = indptr[rows + 1].astype(np.int64) - starts
    owner = np.repeat(np.arange(rows.size), lengths)
    first = np.concatenate(([0], np.cumsum(lengths)[:-1])) if rows.size else np.zeros(0, np.int64)
    return starts[owner] + np.arange(owner.size) - first[owner], owner


def cm_levels(indptr, indices, degree, order, stamp, parent, *, root, base, lo, hi, depth, pass_id, max_levels):
    """``cm_levels``: breadth-first levels of one Cuthill-McKee pass, from ``[lo, hi)`` of ``order`` on.

    A fresh pass (``root >= 0``) first puts ``root`` at ``order[lo]``. Each level's
    unvisited neighbours (``stamp`` below ``pass_id``) go to the earliest position
    of the level among their neighbours, and each position's group follows the
    level in (degree, index) order; they are stamped ``pass_id``. The kernel
    stops with ``SORT`` after a level holding a group of more than
    ``CM_SORT_ON_DEVICE`` vertices, left for the host to sort; here every group
    is sorted, so this returns what the kernel and the host give together.

    Returns
    -------
    dict
        ``status`` (``DONE`` or ``LIMIT``: more than ``max_levels`` levels),
        ``levels`` (the levels so far, the root's counted), ``lo``, ``hi`` (the last
        level), ``prev_lo``, ``prev_hi`` (the one before, -1 at the root) and, when
        done, ``best``: the least :func:`vertex_keys` of the last level. A finished
        pass leaves ``parent`` all ``UNCLAIMED`` again.
    """
    if root >= 0:
        order[lo] = root
        stamp[root] = pass_id
    prev_lo = prev_hi = -1
    while True:
        entries, owner = _entries(indptr, order[lo:hi])
        at = (lo + owner).astype(np.int64)
        w = indices[entries]
        free = stamp[w] < pass_id
        np.minimum.at(parent, w[free], at[free].astype(parent.dtype))
        mine = parent[w] == at
        children, by = w[mine], at[mine]
        total = int(children.size)
        if total:
            children = children[np.lexsort((children, degree[children], by))]
            order[hi:hi + total] = children
            stamp[children] = pass_id
        if total == 0:
            break
        prev_lo, prev_hi, lo, hi, depth = lo, hi, hi, hi + total, depth + 1
        if depth + 1 > max_levels:
            return dict(status=LIMIT, levels=depth + 1, lo=lo, hi=hi, prev_lo=prev_lo, prev_hi=prev_hi, best=0)
    parent[order[base:hi]] = UNCLAIMED
    best = int(vertex_keys(degree, order[lo:hi]).min())
    return dict(status=DONE, levels=depth + 1, lo=lo, hi=hi, prev_lo=prev_lo, prev_hi=prev_hi, best=best)


def permute_rows(perm, inverse, indptr, indices):
    """``permute_rows`` (with the host's sort of rows longer than ``CM_SORT_ON_DEVICE``): the pattern of
    ``P A P^T``, row ``i`` from row ``perm[i]``, columns renumbered and sorted.

    Returns
    -------
    new_indptr, new_indices : int64 arrays
    source : int64 array
        The entry of ``A`` each new entry comes from (``data[source]`` are the new values).
    """
    perm = np.asarray(perm, dtype=np.int64)
    source, owner = _entries(np.asarray(indptr, dtype=np.int64), perm)
    lengths = np.bincount(owner, minlength=perm.size)
    new_indptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    columns = np.asarray(inverse, dtype=np.int64)[indices[source]]
    ordering = np.lexsort((columns, owner))
    return new_indptr, columns[ordering], source[ordering]
