"""NumPy meaning of the kernels in ``multirhs.cu`` (used by the tests).

The vectors are ``(n, k)`` arrays, one column a right-hand side; ``p`` is a pair of buffers, and
``states`` is a list of k dicts with the fields of the device ``State`` struct, one a column. An
iteration is :func:`direction` then :func:`update`; the set-up pass is :func:`update` on columns whose
iteration is -1. A column that has stopped is left untouched by both.
"""
import numpy as np

from .pcg_ref import RUNNING, classic_decision, take_curvature


def _precondition(dinv, r):
    return r * dinv if dinv is not None else r.copy()


def direction(A, dinv, r, p, states):
    """``mr_direction``: p_new = M^-1 r + beta p_old into the other buffer of p, pq = p_new . A p_new and
    alpha = rz / pq (or a stop reason) of every running column."""
    for c, state in enumerate(states):
        if state["status"] != RUNNING or state["iteration"] < 0:
            continue
        cur = state["parity"]
        p_new = state["beta"] * p[cur][:, c] + _precondition(dinv, r[:, c])
        p[1 - cur][:, c] = p_new
        take_curvature(state, float(np.dot(p_new, A @ p_new)))


def update(A, dinv, x, r, p, states):
    """``mr_update``: x += alpha p_new, r -= alpha A p_new; then r.z, r.r and the decision of every
    running column (the set-up pass, where iteration is -1, computes r.z and r.r only)."""
    for c, state in enumerate(states):
        if state["status"] != RUNNING:
            continue
        start = state["iteration"] < 0
        if not start:
            p_new = p[1 - state["parity"]][:, c]
            x[:, c] += state["alpha"] * p_new
            r[:, c] -= state["alpha"] * (A @ p_new)
        rc = r[:, c]
        classic_decision(state, start, state["iteration"] + 1, rc, _precondition(dinv, rc))


def residual(A, x, b):
    """``mr_residual``: b - A x of every column."""
    return b - A @ x
