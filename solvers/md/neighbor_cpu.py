"""Neighbour lists and pair forces of the NumPy backends.

Pairs come from ``scipy.spatial.cKDTree`` (periodic through ``boxsize`` for one
process; plain over owned atoms and ghost copies for a rank of a distributed run).
A list (:class:`PairList`) is a half list in rows: pairs ``(i, j)`` ordered by
``i``, then ``j``. A pair across the periodic boundary refers to an image of
``j``, an extra atom at ``y[source] + shift``, so a step needs no minimum-image
arithmetic: positions are taken in the frame of the list's build
(:func:`build_frame`), in which the images recorded then still apply.

Forces are worked out in blocks of rows small enough to stay in the CPU's cache
and in place (every pass over a million pairs that leaves the cache costs a
millisecond): separations by gathers, the pair terms, then the forces on ``i``
as a sum over each row and those on ``j`` by an unbuffered scatter-add.

One process (:class:`CandidatePairs`): the tree is asked for the pairs within
a wider radius, and the Verlet lists of the next few list builds are cut from
those candidates by distance, which costs a fraction of a tree query.
"""
import numpy as np
from scipy.spatial import cKDTree

from ..kernels.md_ref import minimum_image
from .forcefield import WORK_ROWS

# Pairs per block: about ten arrays of this length are live at once, 1.3 MB, inside a core's L2 cache.
BLOCK_PAIRS = 16384
# Rows of work space per block: separations (3) and squared distances; the potential's own rows follow.
_PAIR_ROWS = 4
NO_SHIFT = 13  # image code of (0, 0, 0): codes are sum_k (s_k + 1) 3^k for shifts s_k in {-1, 0, 1}


def _tree(x, box=None):
    # An unbalanced tree of plain nodes builds and is searched faster for particles of uniform density.
    return cKDTree(x, boxsize=box, balanced_tree=False, compact_nodes=False)


def _sorted(pairs, n):
    """Pairs (rows ``(i, j)`` of an (m, 2) int64 array, indices below ``n``) sorted by ``i``, then ``j``:
    two int64 arrays."""
    bits = max(int(n - 1).bit_length(), 1)
    if 2 * bits > 63:  # too many atoms to pack a pair into one int64 key
        order = np.lexsort((pairs[:, 1], pairs[:, 0]))
        return pairs[order, 0], pairs[order, 1]
    key = pairs[:, 0] << bits
    key |= pairs[:, 1]
    key.sort()
    j = key & ((1 << bits) - 1)
    key >>= bits
    return key, j


def build_pairs(x, box, rlist):
    """All pairs ``i < j`` closer than ``rlist`` (minimum image), sorted by ``i``, then ``j``.

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
    return _sorted(_tree(x, box).query_pairs(rlist, output_type="ndarray"), len(x))


def local_pairs(y, n_owned, rlist):
    """Pairs ``i < j`` closer than ``rlist`` among owned atoms ``[0, n_owned)`` and ghosts, no periodicity.

    Pairs of two ghosts are left out: their owners compute them. Sorted by ``i``, then ``j``.
    """
    pairs = _tree(y).query_pairs(rlist, output_type="ndarray")
    return _sorted(pairs[pairs[:, 0] < n_owned], len(y))


def build_frame(x, hold, box):
    """Positions continued from the build positions ``hold``, and the displacements since the build.

    ``hold + min_image(x - hold)``: the frame of the build, in which the pair
    images recorded then still apply (particles move less than half the box
    between builds).
    """
    disp = minimum_image(x - hold, box)
    return hold + disp, disp


def _image_codes(x, i, j, box):
    """Code of the image of ``j`` nearest to ``i`` for each pair (``NO_SHIFT``: ``j`` itself)."""
    cols = [np.ascontiguousarray(x[:, k]) for k in range(3)]
    code = np.full(len(i), NO_SHIFT, np.int8)
    for p in range(0, len(i), BLOCK_PAIRS):
        ib, jb = i[p:p + BLOCK_PAIRS], j[p:p + BLOCK_PAIRS]
        for k, weight in enumerate((1, 3, 9)):
            d = np.take(cols[k], jb, mode="clip")
            d -= np.take(cols[k], ib, mode="clip")
            shift = (d < -0.5 * box[k]).view(np.int8) - (d > 0.5 * box[k]).view(np.int8)
            shift *= weight
            code[p:p + BLOCK_PAIRS] += shift
    return code


def image_shifts(codes):
    """Shift of each image code in whole boxes, shape (len(codes), 3)."""
    codes = np.asarray(codes, np.int64)
    return np.stack([codes % 3, codes // 3 % 3, codes // 9], axis=1) - 1


def _with_images(i, src, code, n_atoms, box):
    """The :class:`PairList` of pairs ``(i, image code of src)`` (already in order), images numbered in order."""
    crossing = np.flatnonzero(code != NO_SHIFT)
    keys = np.take(src, crossing) * 27
    keys += np.take(code, crossing)
    # Images numbered in the order of (source, code), through a table of every possible one.
    used = np.zeros(27 * n_atoms, bool)
    used[keys] = True
    image_keys = np.flatnonzero(used)
    number = np.empty(27 * n_atoms, np.int64)
    number[image_keys] = np.arange(n_atoms, n_atoms + len(image_keys))
    j = src.copy()
    j[crossing] = number[keys]
    return PairList(i, j, n_atoms, images=(image_keys // 27, image_shifts(image_keys % 27) * box))


def _blocks(offsets):
    """Rows split into blocks of about ``BLOCK_PAIRS`` pairs: ``(a0, a1, p0, p1, rows, starts)`` for each,
    rows ``[a0, a1)`` holding pairs ``[p0, p1)``, of which ``rows`` (a slice when all) have any, starting at
    ``starts`` (from p0)."""
    cuts = np.searchsorted(offsets, np.arange(0, offsets[-1], BLOCK_PAIRS))
    cuts = np.unique(np.concatenate([cuts, [len(offsets) - 1]]))
    blocks = []
    for a0, a1 in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        p0, p1 = int(offsets[a0]), int(offsets[a1])
        if p1 > p0:
            rows = a0 + np.flatnonzero(offsets[a0 + 1:a1 + 1] > offsets[a0:a1])
            starts = offsets[rows] - p0
            if len(rows) == a1 - a0:
                rows = slice(a0, a1)  # a view, not a gather and scatter
            blocks.append((a0, a1, p0, p1, rows, starts))
    return blocks


class PairList:
    """A half list and the forces of its pairs.

    Parameters
    ----------
    i, j : ndarray of int64
        Pairs in rows of ``i`` (in order), each row in order of ``j`` (the k-d tree's lists) or as a
        cell list found them; ``i < n_atoms``, ``j < n_atoms`` or an image.
    n_atoms : int
        Atoms the indices refer to (owned and ghosts).
    images : (ndarray (G,) of int64, ndarray (G, 3)), optional
        Source atom and shift of the image atoms ``n_atoms .. n_atoms + G - 1``.
    counts : ndarray (n_atoms,) of int64, optional
        Pairs in each row, where the builder knows them (else counted from ``i``).
    """

    def __init__(self, i, j, n_atoms, images=None, counts=None):
        self.i, self.j, self.n_atoms = i, j, n_atoms
        if images is None:
            images = (np.empty(0, np.int64), np.empty((0, 3)))
        self.image_source, self.image_shift = images
        if counts is None:
            counts = np.bincount(i, minlength=n_atoms)
        self._counts = counts
        self.offsets = np.zeros(n_atoms + 1, np.int64)
        np.cumsum(counts, out=self.offsets[1:])
        self._blocks = None  # blocks and work space of compute and within, set up at their first call

    def _set_up_blocks(self):
        self._blocks = _blocks(self.offsets)
        n_all = self.n_atoms + len(self.image_source)
        self._y, self._f = np.empty((3, n_all)), np.empty((3, n_all))
        width = max((b[3] - b[2] for b in self._blocks), default=0)
        self._work = np.empty((_PAIR_ROWS + WORK_ROWS, width))

    def __len__(self):
        return len(self.i)

    @property
    def nbytes(self):
        """Bytes held by the list and its work space."""
        space = (self._y, self._f, self._work) if self._blocks is not None else ()
        return sum(a.nbytes for a in (self.i, self.j, self._counts, self.offsets) + space)

    def source(self, j):
        """The atom each index of ``j`` is (itself, or the source of the image)."""
        src = j.copy()
        image = np.flatnonzero(j >= self.n_atoms)
        src[image] = self.image_source[j[image] - self.n_atoms]
        return src

    def _load(self, y):
        if self._blocks is None:
            self._set_up_blocks()
        n = self.n_atoms
        self._y[:, :n] = y.T
        if len(self.image_source):
            np.add(y[self.image_source].T, self.image_shift.T, out=self._y[:, n:])

    def _separations(self, block):
        """``y[j] - y[i]`` of a block's pairs, shape (3, pairs), and their squared lengths."""
        a0, a1, p0, p1 = block[:4]
        d, rsq = self._work[:3, :p1 - p0], self._work[3, :p1 - p0]
        j, counts = self.j[p0:p1], self._counts[a0:a1]
        for k in range(3):
            # Indices are in range by construction; "clip" spares numpy's buffered bounds checks.
            np.take(self._y[k], j, out=d[k], mode="clip")
            d[k] -= np.repeat(self._y[k, a0:a1], counts)
        np.einsum("kp,kp->p", d, d, out=rsq)
        return d, rsq

    def within(self, y, r):
        """Mask of the pairs at most ``r`` apart at positions ``y`` (as the k-d tree counts them)."""
        self._load(y)
        keep = np.empty(len(self), bool)
        for block in self._blocks:
            p0, p1 = block[2:4]
            rsq = self._separations(block)[1]
            np.less_equal(rsq, r * r, out=keep[p0:p1])
        return keep

    def compute(self, y, potential, n_out, energy=False):
        """Pair forces on atoms ``[0, n_out)``; with ``energy`` also their halves of pair energy and virial.

        Parameters
        ----------
        y : ndarray (n_atoms, 3)
            Positions in the frame of the list's build.
        potential : LennardJones or Morse
        n_out : int
        energy : bool

        Returns
        -------
        (f, pe_atom, vir_atom)
            ``pe_atom`` and ``vir_atom`` are None without ``energy``. A pair gives
            each of its atoms half its energy and virial; halves of ghosts are
            left to their owners.
        """
        self._load(y)
        f = self._f
        f.fill(0.0)
        halves = np.zeros((2, f.shape[1])) if energy else None
        for block in self._blocks:
            p0, p1, rows, starts = block[2:]
            j = self.j[p0:p1]
            d, rsq = self._separations(block)
            fr, e, w = potential.terms(rsq, energy, work=self._work[_PAIR_ROWS:, :p1 - p0])
            for k in range(3):
                d[k] *= fr
                f[k, rows] -= np.add.reduceat(d[k], starts)
                np.add.at(f[k], j, d[k])
            if energy:
                for total, v in zip(halves, (e, w)):
                    v *= 0.5
                    total[rows] += np.add.reduceat(v, starts)
                    np.add.at(total, j, v)
        forces = self._fold(f)[:, :n_out].T.copy()
        if not energy:
            return forces, None, None
        pe, vir = self._fold(halves)[:, :n_out]
        return forces, pe, vir

    def _fold(self, per_atom):
        """Rows of per-atom sums with each image's sum added to its source atom (in place); the atoms' part."""
        n = self.n_atoms
        if len(self.image_source):
            for row in per_atom:
                row[:n] += np.bincount(self.image_source, row[n:], n)
        return per_atom[:, :n]


class CandidatePairs:
    """Pairs closer than ``radius`` at wrapped positions ``x``, from which Verlet lists are cut.

    A pair closer than ``rlist`` now was closer than ``rlist + 2 m`` at ``x`` if no
    atom has moved more than ``m`` since. So while every atom is within
    ``(radius - rlist) / 2`` of its place at ``x`` (:meth:`covers`), the pairs
    closer than ``rlist`` are found among the candidates by distance
    (:meth:`verlet`), the same list in the same order as a tree query would give.

    Parameters
    ----------
    x : ndarray (N, 3)
        Wrapped positions.
    box : ndarray (3,)
    radius : float
    """

    def __init__(self, x, box, radius):
        self.hold, self.box, self.radius = x.copy(), box, radius
        i, self._src = build_pairs(x, box, radius)
        self._codes = _image_codes(x, i, self._src, box)
        self.pairs = _with_images(i, self._src, self._codes, len(x), box)

    @property
    def nbytes(self):
        """Bytes held by the candidates."""
        return self.pairs.nbytes + self._src.nbytes + self._codes.nbytes + self.hold.nbytes

    def covers(self, x, rlist):
        """Whether every pair closer than ``rlist`` at wrapped positions ``x`` is a candidate."""
        disp = minimum_image(x - self.hold, self.box)
        return np.einsum("ij,ij->i", disp, disp).max(initial=0.0) <= (0.5 * (self.radius - rlist)) ** 2

    def verlet(self, x, rlist):
        """The :class:`PairList` of the pairs closer than ``rlist`` at wrapped positions ``x`` (which
        :meth:`covers` must accept), with the images that apply in ``x``'s frame."""
        y = build_frame(x, self.hold, self.box)[0]
        keep = np.flatnonzero(self.pairs.within(y, rlist))
        i, src, code = (np.take(a, keep) for a in (self.pairs.i, self._src, self._codes))
        # y = x + k box: an image shift of the candidates' frame changes by the boxes between the frames.
        offset = np.rint((y - x) / self.box).astype(np.int8) @ np.array([1, 3, 9], np.int8)
        code += np.take(offset, src)
        code -= np.take(offset, i)
        return _with_images(i, src, code, len(x), self.box)
