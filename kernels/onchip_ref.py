"""NumPy meaning of ``onchip.cu``: each system solved alone by classic PCG (the steps of ``pcg_ref``) or,
compiled with ONCHIP_SINGLE, by single-reduction PCG (``pcg_ref.pcg1_step``)."""
import numpy as np

from .pcg_ref import RUNNING, direction_product, pcg1_step, pcg_update


def solve_system(A, dinv, b, x, tol, maxiter, variant="classic"):
    """What ``onchip_pcg``'s block (or cluster) does for one system: ``x`` (holding x0) becomes the solution.

    Returns
    -------
    (int, int, float)
        The stop code, the iterations made and the recursive ``||r||`` at the stop.
    """
    state = dict(tol=tol, maxiter=maxiter, status=RUNNING, iteration=-1, parity=0, beta=0.0, rz=0.0,
                 alpha=0.0, pq=0.0, rnorm=0.0)
    r = b - A @ x
    if variant == "single-reduction":  # the set-up pass is the iteration from zero p, s and w
        p, r, s, w = np.zeros_like(b), [r, np.zeros_like(b)], np.zeros((2,) + b.shape), np.zeros((2,) + b.shape)
        while state["status"] == RUNNING:
            pcg1_step(A, dinv, x, p, r, s, w, state)
        return state["status"], state["iteration"], state["rnorm"]
    p0, p1 = np.zeros_like(b), np.zeros_like(b)
    z = pcg_update(x, r, None, p0, p1, dinv, state, start=True)
    while state["status"] == RUNNING:
        q = direction_product(A, z, p0, p1, state)
        if state["status"] != RUNNING:
            break
        z = pcg_update(x, r, q, p0, p1, dinv, state)
    return state["status"], state["iteration"], state["rnorm"]
