"""The largest eigenvalue of the Jacobi-scaled matrix ``D^{-1} A``, estimated by a few Lanczos steps.

``D^{-1} A`` is self-adjoint in the ``D`` inner product, so Lanczos runs on the
symmetric ``D^{-1/2} A D^{-1/2}``, which has the same eigenvalues. Ritz values lie
inside the spectrum: the largest one approaches ``lambda_max`` from below within
a few steps, which is why the users of the estimate add a safety factor.
It runs where its arrays are: NumPy on the host, CuPy (a ``cupyx`` matrix) on the GPU.
"""
import numpy as np
import scipy.linalg

from ...backend import array_module
from ...errors import InputError
from ...kernels.amg_setup_ref import node_hash

#: Lanczos steps by default: hypre's Chebyshev smoother estimates its bound with 10 CG
#: steps (``cheby_eig_est``); PyAMG's ``approximate_spectral_radius`` takes up to 15.
LANCZOS_STEPS = 10


def start_vector(n, xp=np, seed=0):
    """``n`` pseudo-random entries in [-1/2, 1/2) from a hash of the index: the same bits on the host and the GPU.

    The estimate then does not depend on where it runs (a CPU and a GPU cycle on the
    same hierarchy smooth with the same intervals).
    """
    return node_hash(xp.arange(n), seed).astype(np.float64) / 2.0 ** 32 - 0.5


def largest_scaled_eigenvalue(A, inverse_diagonal, steps=LANCZOS_STEPS, seed=0):
    """The largest Ritz value of ``D^{-1} A`` after ``steps`` Lanczos steps (at most ``lambda_max``).

    Parameters
    ----------
    A : scipy.sparse or cupyx.scipy.sparse matrix
        Symmetric, with a positive diagonal ``D``.
    inverse_diagonal : ndarray (NumPy or CuPy, as ``A``)
        ``1 / diag(A)``.
    steps : int
        Lanczos steps (matrix-vector products); fewer when the Krylov space is exhausted.
    seed : int
        Seed of the start vector (:func:`start_vector`): the same matrix gives the same bounds.

    Returns
    -------
    float
        The estimate, computed in float64.
    """
    n = A.shape[0]
    if n == 0:  # no eigenvalues: 1, the mean eigenvalue of any D^{-1} A, keeps the users' scalars finite
        return 1.0
    xp = array_module(inverse_diagonal)
    scale = xp.sqrt(inverse_diagonal.astype(np.float64))
    v = start_vector(n, xp, seed)
    v /= xp.linalg.norm(v)
    v_prev = xp.zeros(n)
    alphas, betas = [], []
    beta = 0.0
    for _ in range(min(int(steps), n)):
        w = scale * (A @ (scale * v)) - beta * v_prev
        alpha = float(v @ w)
        w -= alpha * v
        alphas.append(alpha)
        beta = float(xp.linalg.norm(w))
        if not np.isfinite(alpha) or not np.isfinite(beta):
            raise InputError("the matrix's eigenvalue estimate is not finite (NaN or Inf from A @ v)")
        if beta <= 1e-12 * abs(alpha):  # an invariant subspace: its Ritz values are exact
            break
        betas.append(beta)
        v_prev, v = v, w / beta
    ritz = scipy.linalg.eigvalsh_tridiagonal(np.array(alphas), np.array(betas[: len(alphas) - 1]))
    return float(ritz[-1])
