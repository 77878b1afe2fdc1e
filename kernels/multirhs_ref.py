"""NumPy meaning of the kernels in ``multirhs.cu`` (used by the tests).

The vectors are ``(n, k)`` arrays, one column a right-hand side; ``r`` and ``p`` are pairs of
buffers, and ``states`` is a list of k dicts with the fields of the device ``State`` struct, one a
column. An iteration is :func:`direction` then :func:`update`; the set-up pass is :func:`update` on
columns whose iteration is -1. A column that has stopped is left untouched by both.
"""
import numpy as np

from .pcg_ref import BREAKDOWN, NOT_FINITE, RUNNING, stop_reason


def _direction(A, dinv, r, p, state, c):
    """p_new = M^-1 r + beta p_old and q = A p_new of column ``c`` (from its current buffers)."""
    cur = state["parity"]
    z = r[cur][:, c] * dinv if dinv is not None else r[cur][:, c].copy()
    p_new = state["beta"] * p[cur][:, c] + z
    return p_new, A @ p_new


def direction(A, dinv, r, p, states):
    """``mr_direction``: pq = p_new . A p_new and alpha = rz / pq (or a stop reason) of every running column."""
    for c, state in enumerate(states):
        if state["status"] != RUNNING or state["iteration"] < 0:
            continue
        p_new, q = _direction(A, dinv, r, p, state, c)
        pq = float(np.dot(p_new, q))
        state["pq"] = pq
        if not np.isfinite(pq):
            state["status"] = NOT_FINITE
        elif pq <= 0:
            state["status"] = BREAKDOWN
        else:
            state["alpha"] = state["rz"] / pq


def update(A, dinv, x, r, p, states):
    """``mr_update``: x += alpha p_new, r_new = r - alpha q into the other buffers (p_new too); then
    r.z, r.r and the decision of every running column (the set-up pass where iteration is -1)."""
    for c, state in enumerate(states):
        if state["status"] != RUNNING:
            continue
        start = state["iteration"] < 0
        cur = state["parity"]
        if start:
            rc = r[cur][:, c]
        else:
            p_new, q = _direction(A, dinv, r, p, state, c)
            x[:, c] += state["alpha"] * p_new
            rc = r[cur][:, c] - state["alpha"] * q
            r[1 - cur][:, c] = rc
            p[1 - cur][:, c] = p_new
        z = rc * dinv if dinv is not None else rc
        rz, rnorm = float(np.dot(rc, z)), float(np.sqrt(np.dot(rc, rc)))
        it = state["iteration"] + 1
        status = stop_reason(rnorm, state["tol"], it, state["maxiter"], rz)
        if status == RUNNING:
            state["beta"] = 0.0 if start else rz / state["rz"]
            state["rz"] = rz
            if not start:
                state["parity"] ^= 1
        state.update(iteration=it, rnorm=rnorm, status=status)


def residual(A, x, b):
    """``mr_residual``: b - A x of every column."""
    return b - A @ x
