"""Cuthill-McKee ordering of a symmetric sparsity pattern, on the GPU (``kernels/reorder.cu``) or in NumPy.

The ordering (Cuthill and McKee 1969): breadth-first levels from a start
vertex; a new level's vertices follow the earliest position of a neighbour in
the level before, then their degree, then their index. So defined it does not
depend on how threads are scheduled: the GPU and the NumPy reference
(``kernels/reorder_ref.py``) give the same permutation, entry for entry.

Each connected component is ordered in turn, from the unordered vertex of least
(degree, index); a step of George and Liu's search moves the start to a
pseudo-peripheral vertex (the vertex of least (degree, index) in the last level,
when that gives more levels), since a start at the rim gives more, narrower
levels. Vertices without
neighbours come first, all at once. Reversed, this is reverse Cuthill-McKee
(:mod:`solvers.reorder`).

On the GPU one pass runs all its levels in one persistent kernel; the host
reads its outcome once a pass (and sorts the rare groups too large for the
kernel: the children of a vertex of very high degree).
"""
import collections

import numpy as np

from .backend import array_module
from .kernels import reorder_ref
from .kernels.structs import Struct

#: Breadth-first passes of the search for a pseudo-peripheral start, after the first, at most. More
#: steps of George and Liu's search hardly change the locality RCM finds (sectors a nonzero, 200k-row
#: random geometric graph: 0.161 after one, 0.158 after three) and each costs a pass of its levels.
PERIPHERAL_SEARCHES = 1
#: Largest group of one vertex's new neighbours, and longest row, the kernels sort (larger: the host).
SORT_ON_DEVICE = 64
#: Threads a block of ``cm_levels``, and lanes that walk one vertex's row together.
BLOCK, LANES = 512, 8

CM_RESULT = Struct("CMResult", [("best", "unsigned long long"), ("status", "int"), ("levels", "int"),
                                ("lo", "int"), ("hi", "int"), ("prev_lo", "int"), ("prev_hi", "int")])
CM_PASS = Struct("CMPass", [("indptr", "const int*"), ("indices", "const int*"), ("degree", "const int*"),
                            ("order", "int*"), ("stamp", "int*"), ("parent", "int*"), ("count", "int*"),
                            ("offset", "int*"), ("block_total", "int*"), ("big", "int*"),
                            ("counter", "unsigned long long*"), ("result", "CMResult*"), ("root", "int"),
                            ("base", "int"), ("lo", "int"), ("hi", "int"), ("depth", "int"), ("pass_id", "int"),
                            ("max_levels", "int")])

#: What :func:`cuthill_mckee` returns: the order (new position -> vertex), and what it took.
Ordering = collections.namedtuple("Ordering", "order levels passes components")

_NO_LIMIT = 2**31 - 1


def program():
    """The arguments of :func:`solvers.kernels.module` for ``reorder.cu``."""
    return dict(name="reorder", defines=(("CM_BLOCK", str(BLOCK)), ("CM_LANES", str(LANES)),
                                         ("CM_SORT_ON_DEVICE", str(SORT_ON_DEVICE))), structs=(CM_RESULT, CM_PASS))


def degrees(indptr, indices):
    """Neighbours of each vertex: its row's entries off the diagonal (int32, where the arrays are)."""
    xp = array_module(indptr)
    if xp is np:
        return reorder_ref.cm_degree(indptr, indices)
    from . import kernels
    n = int(indptr.size) - 1
    degree = xp.zeros(n, dtype=xp.int32)
    if n:
        kernel = kernels.module(**program()).get_function("cm_degree")
        kernel((min(-(-n // 256), 65535),), (256,), (np.int32(n), xp.ascontiguousarray(indptr, dtype=xp.int32),
                                                     xp.ascontiguousarray(indices, dtype=xp.int32), degree))
    return degree


class _Arrays:
    """The state of an ordering: the pattern, degrees, two order buffers, stamps and claims."""

    def __init__(self, indptr, indices, xp):
        n = int(indptr.size) - 1
        self.xp, self.n = xp, n
        self.indptr = xp.ascontiguousarray(indptr, dtype=xp.int32)
        self.indices = xp.ascontiguousarray(indices, dtype=xp.int32)
        self.degree = degrees(self.indptr, self.indices)
        self.buffers = (xp.zeros(n, dtype=xp.int32), xp.zeros(n, dtype=xp.int32))
        self.stamp = xp.full(n, -1, dtype=xp.int32)
        self.parent = xp.full(n, reorder_ref.UNCLAIMED, dtype=xp.int32)


class _HostLevels(_Arrays):
    """A pass's levels in NumPy (``reorder_ref.cm_levels``)."""

    def __init__(self, indptr, indices):
        super().__init__(indptr, indices, np)

    def run(self, order, root, base, pass_id, max_levels):
        return reorder_ref.cm_levels(self.indptr, self.indices, self.degree, order, self.stamp, self.parent,
                                     root=root, base=base, lo=base, hi=base + 1, depth=0, pass_id=pass_id,
                                     max_levels=max_levels)


class _DeviceLevels(_Arrays):
    """A pass's levels on the GPU: ``cm_levels`` launched cooperatively, resumed after a host sort."""

    def __init__(self, indptr, indices):
        import cupy

        from . import kernels
        super().__init__(indptr, indices, cupy)
        kernel = kernels.module(**program()).get_function("cm_levels")
        self._launch, capacity = kernels.cooperative(kernel, BLOCK)
        sms = int(kernels.device_attribute("MultiProcessorCount"))
        # two blocks an SM: enough groups of lanes for a level of ten thousand vertices, and a barrier
        # of more blocks costs more
        self.grid = max(1, min(capacity, 2 * sms))
        self.count = cupy.zeros(self.n, dtype=cupy.int32)
        self.offset = cupy.zeros(self.n, dtype=cupy.int32)
        self.block_total = cupy.zeros(self.grid, dtype=cupy.int32)
        self.big = cupy.zeros(self.n + 1, dtype=cupy.int32)
        self.counter = cupy.zeros(1, dtype=cupy.uint64)
        self.result = cupy.zeros(CM_RESULT.dtype.itemsize, dtype=cupy.uint8)

    def run(self, order, root, base, pass_id, max_levels):
        lo, hi, depth = base, base + 1, 0
        while True:
            args = CM_PASS.pack(indptr=self.indptr, indices=self.indices, degree=self.degree, order=order,
                                stamp=self.stamp, parent=self.parent, count=self.count, offset=self.offset,
                                block_total=self.block_total, big=self.big, counter=self.counter,
                                result=self.result, root=root, base=base, lo=lo, hi=hi, depth=depth,
                                pass_id=pass_id, max_levels=max_levels)
            self._launch(self.grid, (args,))
            out = CM_RESULT.read(self.result.get())
            result = {name: int(out[name]) for name in CM_RESULT.dtype.names}
            if result["status"] != reorder_ref.SORT:
                return result
            self._sort_groups(order, result)
            root, lo, hi, depth = -1, result["lo"], result["hi"], result["levels"] - 1

    def _sort_groups(self, order, result):
        """Sort the groups of the level just placed that the kernel did not (more than ``SORT_ON_DEVICE``)."""
        xp = self.xp
        counts = self.count[result["prev_lo"]:result["prev_hi"]]
        starts = result["lo"] + xp.cumsum(counts) - counts
        big = xp.flatnonzero(counts > SORT_ON_DEVICE)
        group, positions = segments(starts[big], counts[big], xp)
        vertices = order[positions]
        ordering = xp.lexsort(xp.stack((vertices, self.degree[vertices], group)))
        order[positions] = vertices[ordering]


def segments(starts, sizes, xp):
    """The positions of the segments ``[starts[k], starts[k] + sizes[k])``, one after the other, and the
    segment ``k`` of each (int32)."""
    bounds = xp.cumsum(sizes, dtype=xp.int64)
    total = int(bounds[-1]) if bounds.size else 0
    everything = xp.arange(total, dtype=xp.int64)
    group = xp.searchsorted(bounds, everything, side="right").astype(xp.int32)
    return group, starts.astype(xp.int64)[group] + everything - (bounds - sizes)[group]


def cuthill_mckee(indptr, indices, max_levels=None, max_passes=None):
    """The Cuthill-McKee order of a symmetric CSR pattern without duplicate entries.

    Computed where the arrays are: CuPy arrays on the GPU, NumPy arrays by the
    reference. Both give the same order.

    Parameters
    ----------
    indptr, indices : int arrays (NumPy or CuPy)
    max_levels, max_passes : int, optional
        Give up (return None) rather than run more breadth-first levels or passes
        than this, over all components: what the ordering costs grows with both.

    Returns
    -------
    Ordering or None
        ``order[i]`` is the vertex at position ``i`` (int32), with the levels and
        passes it took and the number of components.
    """
    xp = array_module(indptr)
    n = int(indptr.size) - 1
    if n == 0:
        return Ordering(xp.zeros(0, dtype=xp.int32), 0, 0, 0)
    search = _HostLevels(indptr, indices) if xp is np else _DeviceLevels(indptr, indices)
    max_levels = _NO_LIMIT if max_levels is None else int(max_levels)
    max_passes = _NO_LIMIT if max_passes is None else int(max_passes)
    order, stamp, degree = search.buffers[0], search.stamp, search.degree
    isolated = xp.flatnonzero(degree == 0).astype(xp.int32)
    placed = components = int(isolated.size)
    order[:placed] = isolated
    stamp[isolated] = reorder_ref.PLACED
    keys = (degree.astype(xp.int64) << 32) | xp.arange(n, dtype=xp.int64)  # (degree, index), as cm_key
    levels = passes = pass_id = 0
    while placed < n:
        root = int(xp.argmin(xp.where(stamp == reorder_ref.PLACED, np.int64(np.iinfo(np.int64).max), keys)))
        best = None  # (buffer, result) of the deepest pass so far
        for _ in range(1 + PERIPHERAL_SEARCHES):
            if passes >= max_passes or levels >= max_levels:
                return None
            out = 0 if best is None else 1 - best[0]
            pass_id += 1
            passes += 1
            result = search.run(search.buffers[out], root, placed, pass_id, max_levels - levels)
            if result["status"] == reorder_ref.LIMIT:
                return None
            levels += result["levels"]
            if best is not None and result["levels"] <= best[1]["levels"]:
                break
            best = (out, result)
            root = result["best"] & 0xFFFFFFFF
        size = best[1]["hi"] - placed
        if best[0] == 1:
            order[placed:placed + size] = search.buffers[1][placed:placed + size]
        stamp[order[placed:placed + size]] = reorder_ref.PLACED
        placed += size
        components += 1
    return Ordering(order, levels, passes, components)
