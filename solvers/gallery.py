"""Test problems generated on the fly (never stored as files)."""
import numpy as np
import scipy.sparse as sp


def _laplacian(shape, weights, dtype):
    """Sum over axes of ``weight_k * I (x) T_k (x) I`` with ``T_k = tridiag(-1, 2, -1)``."""
    n = int(np.prod(shape))
    A = sp.csr_matrix((n, n))
    for k, (m, w) in enumerate(zip(shape, weights)):
        T = sp.diags([-np.ones(m - 1), 2 * np.ones(m), -np.ones(m - 1)], [-1, 0, 1])
        left = sp.identity(int(np.prod(shape[:k])))
        right = sp.identity(int(np.prod(shape[k + 1:])))
        A = A + w * sp.kron(sp.kron(left, T), right)
    A = sp.csr_matrix(A, dtype=dtype)
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
