"""Test problems generated on the fly (never stored as files)."""
import numpy as np
import scipy.sparse as sp


def _laplacian(shape, weights, dtype):
    """Finite-difference Laplacian on a ``shape`` grid, axis ``k`` coupled with ``weights[k]``.

    Built from its diagonals (fast even for tens of millions of rows):
    ``2 * sum(w)`` on the diagonal, ``-w_k`` to each neighbour along axis k
    that lies inside the grid (Dirichlet walls).
    """
    shape = tuple(int(m) for m in shape)
    n = int(np.prod(shape))
    offsets, diags = [0], [np.full(n, 2.0 * sum(weights))]
    stride = 1
    for axis in reversed(range(len(shape))):  # C order: the last axis has stride 1
        m, w = shape[axis], weights[axis]
        if m > 1:
            coupled = np.ones(n - stride)
            # no coupling across the wall between the last point of one line and the first of the next
            coupled[(np.arange(n - stride) // stride) % m == m - 1] = 0.0
            offsets += [stride, -stride]
            diags += [-w * coupled, -w * coupled]
        stride *= m
    A = sp.diags(diags, offsets, shape=(n, n), format="csr", dtype=dtype)
    A.eliminate_zeros()
    A.sort_indices()
    return A


def poisson(shape, dtype=np.float64):
    """Finite-difference Laplacian (5-point in 2-D, 7-point in 3-D) with Dirichlet walls.

    Parameters
    ----------
    shape : tuple of int
        Grid points per dimension, e.g. ``(64, 64)`` or ``(64, 64, 64)``.

    Returns
    -------
    scipy.sparse.csr_matrix
        SPD matrix of size ``prod(shape)``.
    """
    return _laplacian(shape, [1.0] * len(shape), dtype)


def anisotropic_diffusion(shape, eps=1e-3, dtype=np.float64):
    """Laplacian whose first-axis coupling is scaled by ``eps`` (hard for Jacobi)."""
    return _laplacian(shape, [eps] + [1.0] * (len(shape) - 1), dtype)
