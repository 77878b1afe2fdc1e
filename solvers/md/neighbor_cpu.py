"""Vectorised cell list and half Verlet list for the NumPy backend."""
import itertools

import numpy as np

from ..kernels.md_ref import minimum_image


def cell_grid(box, rlist):
    """Cells per box edge: as many as fit with edges >= ``rlist`` (at least 1)."""
    return np.maximum((np.asarray(box) // rlist).astype(np.int64), 1)


def _offsets(ncell):
    """Neighbour-cell offsets; a half stencil when every edge has >= 3 cells.

    With fewer than 3 cells along an edge, offsets -1 and +1 name the same cell,
    so the full set of distinct cells is used and pairs are filtered by index.
    """
    if np.all(ncell >= 3):
        full = [o for o in itertools.product((-1, 0, 1), repeat=3)]
        return [o for o in full if o > (0, 0, 0)], True
    ranges = [range(3) if n >= 3 else range(n) for n in ncell]
    offs = [tuple(o - 1 if n >= 3 else o for o, n in zip(t, ncell)) for t in itertools.product(*ranges)]
    return offs, False


def build_pairs(x, box, rlist):
    """All pairs ``i < j`` (by index) closer than ``rlist``, minimum image.

    Parameters
    ----------
    x : ndarray, shape (N, 3)
        Positions wrapped into ``[0, box)``.
    box : ndarray, shape (3,)
    rlist : float
        List cutoff (force cutoff plus skin).

    Returns
    -------
    (i, j) : two int64 ndarrays
        Pair indices, in a deterministic order.
    """
    n = len(x)
    ncell = cell_grid(box, rlist)
    c3 = np.minimum((x * (ncell / box)).astype(np.int64), ncell - 1)
    cid = (c3[:, 0] * ncell[1] + c3[:, 1]) * ncell[2] + c3[:, 2]
    order = np.argsort(cid, kind="stable")
    counts = np.bincount(cid, minlength=int(np.prod(ncell)))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    table = np.full((len(counts), int(counts.max())), -1, np.int64)
    table[cid[order], np.arange(n) - starts[cid[order]]] = order
    offsets, half = _offsets(ncell)
    rl2 = rlist * rlist
    out_i, out_j = [], []
    # The home cell with j > i, then (half stencil) each other cell once per pair of cells.
    for o in ([(0, 0, 0)] if half else []) + offsets:
        nb = (c3 + np.array(o)) % ncell
        cand = table[(nb[:, 0] * ncell[1] + nb[:, 1]) * ncell[2] + nb[:, 2]]
        keep = cand >= 0
        if not half or o == (0, 0, 0):
            keep &= cand > np.arange(n)[:, None]
        i, col = np.nonzero(keep)
        j = cand[i, col]
        d = minimum_image(x[j] - x[i], box)
        close = np.einsum("ij,ij->i", d, d) < rl2
        out_i.append(i[close])
        out_j.append(j[close])
    return np.concatenate(out_i), np.concatenate(out_j)
