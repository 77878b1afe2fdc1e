"""Spatial decomposition of a periodic box over ranks: the rank grid, owners, and ghost selection.

Written against an array namespace ``xp`` (NumPy on the CPU, CuPy on GPUs), so
both distributed backends select the same atoms with the same arithmetic.
"""
import itertools

import numpy as np

from ..errors import InputError
from ..kernels import md_ref
from ..kernels.md_params import ROUTES

# The 26 neighbour directions, in the fixed order every rank lists its ghosts in.
OFFSETS = tuple(o for o in itertools.product((-1, 0, 1), repeat=3) if o != (0, 0, 0))
assert len(OFFSETS) == ROUTES


def choose_grid(box, ranks, min_width):
    """Ranks along x, y, z: the split of ``ranks`` whose sub-boxes have the least surface.

    Every sub-box edge must be at least ``min_width`` (the cutoff plus the skin),
    so that ghosts come from adjacent sub-boxes only.

    Raises
    ------
    InputError
        When no split of ``ranks`` gives edges that wide.
    """
    box = np.asarray(box, np.float64)
    best = None
    for px in range(1, ranks + 1):
        if ranks % px:
            continue
        for py in range(1, ranks // px + 1):
            if (ranks // px) % py:
                continue
            grid = (px, py, ranks // px // py)
            w = box / grid
            if w.min() < min_width:
                continue
            area = w[0] * w[1] + w[1] * w[2] + w[0] * w[2]
            if best is None or area < best[0] - 1e-12 * area:
                best = (area, grid)
    if best is None:
        raise InputError(f"{ranks} ranks cannot split the box {' x '.join(f'{b:.6g}' for b in box)} into sub-boxes "
                         f"at least rc + skin = {min_width:.6g} wide: use fewer ranks or a larger system", "--rc")
    return best[1]


class Domain:
    """This rank's sub-box of a uniform grid of sub-boxes over the periodic box.

    Parameters
    ----------
    box : sequence of 3 float
    grid : tuple of 3 int
        Ranks along x, y, z (rank = (cx * py + cy) * pz + cz).
    rank : int
    """

    def __init__(self, box, grid, rank):
        self.box = np.asarray(box, np.float64)
        self.grid = tuple(int(g) for g in grid)
        self.rank = int(rank)
        self.width = self.box / self.grid
        self.coords = np.array(np.unravel_index(self.rank, self.grid))
        self.lo = self.coords * self.width
        self.hi = np.where(self.coords == np.array(self.grid) - 1, self.box, (self.coords + 1) * self.width)

    def owners(self, x, xp=np):
        """Rank owning each wrapped position of ``x`` (N, 3)."""
        grid = xp.asarray(self.grid)
        c = xp.minimum(xp.floor(x / xp.asarray(self.width)).astype(xp.int64), grid - 1)
        c = xp.maximum(c, 0)
        return (c[:, 0] * self.grid[1] + c[:, 1]) * self.grid[2] + c[:, 2]

    def neighbours(self):
        """``(offset, rank, shift)`` for each of :data:`OFFSETS`: who sits there and how my atoms look to it.

        ``shift`` is added to a position of mine to put it in the frame of that
        rank (a multiple of the box edges where the grid wraps around).
        """
        out = []
        for o in OFFSETS:
            c = self.coords + o
            k = np.floor_divide(c, self.grid)
            peer = int(np.ravel_multi_index(tuple(c - k * self.grid), self.grid))
            out.append((o, peer, -k * self.box))
        return out

    def routes(self):
        """:meth:`neighbours` in the order ghosts are sent: by receiving rank, then by offset."""
        return sorted(self.neighbours(), key=lambda route: route[1])

    def route_masks(self, x, reach, xp=np):
        """Bit r set where my position ``x`` (N, 3) goes as a ghost along ``routes()[r]``: it lies within
        ``reach`` (the ghost shell's width) of every face that route's offset points through (what
        ``md_ghost_routes`` computes)."""
        return md_ref.route_masks(x, self.lo, self.hi, reach, [o for o, _, _ in self.routes()], xp)

    def ghost_pairs(self, x, reach, xp=np):
        """Which of the positions ``x`` (N, 3), mine, go where as ghosts: ``(index, route)``.

        Atom ``index[k]`` is sent along ``routes()[route[k]]``. The pairs are
        ordered by route, then by index.
        """
        return md_ref.partition_bits(self.route_masks(x, reach, xp), ROUTES, xp)
