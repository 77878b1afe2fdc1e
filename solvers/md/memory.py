"""Memory a molecular-dynamics run needs, estimated before anything is allocated.

From the atom count (``--cells``, a dump's ``NUMBER OF ATOMS``) and the box
(``--density``, ``BOX BOUNDS``) alone: the particle arrays and the neighbour
list (pairs within the list cutoff at the system's density) on the host for
the NumPy backend (whose k-d tree needs no grid), and on the GPU for the CUDA
one, with its cell grid (one cell per ``rc + skin`` along each edge, with room
for its fullest cell). The estimates are lower bounds of what the backends
allocate, so a refusal is never a false alarm: ``--cells 1000 1000 1000``, or
two atoms in a box of 3000^3 on the GPU (a billion empty cells), are refused
in one line saying how much they would take, instead of failing after minutes.
"""
import math

import numpy as np

from ..resources import require_device_memory, require_host_memory

# Building a state: positions, velocities, images and ids, with the lattice or the parsed dump
# columns they come from and the temporaries of wrapping them into the box.
_STATE_BYTES_PER_ATOM = 200
# NumPy backend: positions, velocities, images, forces, list-build positions, per-atom energy
# and virial, the k-d tree; per pair of the half list its two indices; per candidate pair (the
# pairs within the wider radius the k-d tree is asked for) its two indices, its source atom and
# image code, and the tree's own output while they are sorted.
_CPU_BYTES_PER_ATOM, _CPU_BYTES_PER_PAIR, _CPU_BYTES_PER_CANDIDATE = 200, 16, 40
# CUDA backend: float4 positions (two), velocities, forces, list-build positions and images,
# per-atom sums, order; 4-byte neighbour entries; per cell slot an index, a sorted index and a
# float4 position, per cell a count and a start.
_GPU_BYTES_PER_ATOM, _GPU_BYTES_PER_NEIGHBOUR, _GPU_BYTES_PER_SLOT, _GPU_BYTES_PER_CELL = 120, 4, 24, 8


def _atoms(n):
    return f"{n:,}" if n < 10**12 else f"{n:.3g}"


def require_state(n, source):
    """Refuse building a state of ``n`` atoms that cannot fit in host memory."""
    require_host_memory(_STATE_BYTES_PER_ATOM * n, f"a system of {_atoms(n)} atoms", source)


def _volume_density(n, box):
    volume = float(np.prod(np.asarray(box, float)))
    return volume, (n / volume if volume > 0 else 0.0)


def _pairs_per_atom(n, box, radius):
    """Pairs per atom of the half list of cutoff ``radius`` at the system's density."""
    return 0.5 * min(_volume_density(n, box)[1] * 4.0 / 3.0 * math.pi * radius ** 3, n)


def _cells_and_pairs(n, box, rlist):
    """Cells of the grid, atoms in the fullest cell (at least) and pairs per atom of the half list."""
    edges = [max(int(b // rlist), 1) if math.isfinite(b // rlist) else 1 for b in np.asarray(box, float)]
    cells = math.prod(edges)
    volume, density = _volume_density(n, box)
    per_cell = density * volume / cells
    return cells, max(1, math.ceil(per_cell)), _pairs_per_atom(n, box, rlist)


def require_run(n, box, rlist, device, source, candidates=None):
    """Refuse a run of ``n`` atoms in ``box`` with list cutoff ``rlist`` that cannot fit on ``device``.

    ``candidates``: the radius of the NumPy backend's candidate pairs (``rlist`` if not given).
    """
    cells, per_cell, pairs = _cells_and_pairs(n, box, rlist)
    if device == "cpu":
        wide = _pairs_per_atom(n, box, rlist if candidates is None else candidates)
        need = n * (_CPU_BYTES_PER_ATOM + _CPU_BYTES_PER_PAIR * pairs + _CPU_BYTES_PER_CANDIDATE * wide)
        require_host_memory(int(need), f"a run of {_atoms(n)} atoms", source)
        return
    what = f"a run of {_atoms(n)} atoms in {cells:,} neighbour cells"
    require_host_memory(_STATE_BYTES_PER_ATOM * n, what, source)
    need = (n * (_GPU_BYTES_PER_ATOM + _GPU_BYTES_PER_NEIGHBOUR * 2 * pairs)
            + cells * (_GPU_BYTES_PER_CELL + _GPU_BYTES_PER_SLOT * per_cell))
    require_device_memory(int(need), what, source)
