"""Neighbour pairs and pair forces for the NumPy backends.

Pairs come from ``scipy.spatial.cKDTree`` (periodic through ``boxsize`` for one
process; plain over owned atoms and ghost copies for a rank of a distributed run).
Between list builds each pair keeps the periodic shift it had at the build, so a
step needs no minimum-image arithmetic: positions are taken in the build's frame
(:func:`build_frame`), and the separations are one sparse product.
"""
import numpy as np
import scipy.sparse as sp
from scipy.spatial import cKDTree

from ..kernels.md_ref import minimum_image


def build_pairs(x, box, rlist):
    """All pairs ``i < j`` closer than ``rlist`` (minimum image); the tree's order is deterministic.

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
    """
    pairs = cKDTree(x, boxsize=box).query_pairs(rlist, output_type="ndarray")
    return pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)


def local_pairs(y, n_owned, rlist):
    """Pairs ``i < j`` closer than ``rlist`` among owned atoms ``[0, n_owned)`` and ghosts, no periodicity.

    Pairs of two ghosts are left out: their owners compute them.
    """
    pairs = cKDTree(y).query_pairs(rlist, output_type="ndarray")
    pairs = pairs[pairs[:, 0] < n_owned]
    return pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)


def build_frame(x, hold, box):
    """Positions continued from the build positions ``hold``, and the displacements since the build.

    ``hold + min_image(x - hold)``: the frame of the build, in which the pair
    shifts recorded then still apply (particles move less than half the box
    between builds).
    """
    disp = minimum_image(x - hold, box)
    return hold + disp, disp


class PairForces:
    """Forces of a fixed pair list: separations and their reaction forces as sparse products.

    Parameters
    ----------
    i, j : ndarray of int64
        Pairs (``i`` owned; ``j`` owned or a ghost).
    n_atoms : int
        Atoms the indices refer to (owned and ghosts).
    periodic : (ndarray (n_atoms, 3), ndarray (3,)), optional
        Build positions and box of a single-process list: each pair gets the periodic shift
        that makes ``y[j] - y[i]`` its minimum image at the build.
    """

    def __init__(self, i, j, n_atoms, periodic=None):
        m = len(i)
        self.i, self.j, self.n_atoms = i, j, n_atoms
        # Row p of the gather: +1 at j, -1 at i, so gather @ y = y[j] - y[i].
        cols = np.empty(2 * m, np.int64)
        cols[0::2], cols[1::2] = j, i
        self._gather = sp.csr_matrix((np.tile([1.0, -1.0], m), cols, np.arange(0, 2 * m + 1, 2)), shape=(m, n_atoms))
        self._scatter = self._gather.T.tocsr()
        self._shift_rows = np.empty(0, np.int64)
        if periodic is not None:
            at, box = periodic
            shift = self._gather @ at
            shift /= box
            np.rint(shift, out=shift)
            shift *= -box
            self._shift_rows = np.flatnonzero(np.any(shift != 0.0, axis=1))
            self._shift = shift[self._shift_rows]

    def __len__(self):
        return len(self.i)

    def separations(self, y):
        """``y[j] - y[i]`` (plus the pair shifts), shape (pairs, 3)."""
        d = self._gather @ y
        if self._shift_rows.size:
            d[self._shift_rows] += self._shift
        return d

    def compute(self, y, potential, n_out, energy=False):
        """Pair forces on atoms ``[0, n_out)``; with ``energy`` also their halves of pair energy and virial.

        Returns
        -------
        (f, pe_atom, vir_atom)
            ``pe_atom`` and ``vir_atom`` are None without ``energy``. A pair gives
            each of its atoms half its energy and virial; halves of ghosts are
            left to their owners.
        """
        d = self.separations(y)
        fr, e, w = potential.terms(np.einsum("ij,ij->i", d, d), energy)
        d *= fr[:, None]
        f = (self._scatter @ d)[:n_out]
        if not energy:
            return f, None, None

        def halves(v):
            return 0.5 * (np.bincount(self.i, v, self.n_atoms) + np.bincount(self.j, v, self.n_atoms))[:n_out]

        return f, halves(e), halves(w)
