"""NumPy meaning of the kernels in ``pcg.cu`` (used by the GPU tests).

An iteration of ``pcg_run`` is ``direction_product`` then ``pcg_update`` (its set-up pass is
``pcg_update(start=True)``); an iteration of ``pcg1_run`` is ``pcg1_step``. The split classic
iteration of ``pcg_split.cu`` is ``direction_product``, ``split_update``, the preconditioner, then
``split_decide`` (its set-up pass the preconditioner and ``split_decide``).

``state`` is a dict with the fields of the device ``State`` struct.
"""
import numpy as np

RUNNING, CONVERGED, MAX_ITERATIONS, BREAKDOWN, NOT_FINITE = range(5)


def direction_product(A, z, p0, p1, state):
    """p_new = z + beta p_old; q = A p_new; pq = p_new . q; alpha = rz / pq (or a stop reason)."""
    if state["status"] != RUNNING:
        return None
    p_old, p_new = (p1, p0) if state["parity"] else (p0, p1)
    p_new[:] = state["beta"] * p_old + z
    q = A @ p_new
    take_curvature(state, float(np.dot(p_new, q)))
    return q


def take_curvature(state, pq):
    """Record pq = p.Ap and the step length alpha = rz / pq, or why there is none (a stop reason)."""
    state["pq"] = pq
    if not np.isfinite(pq):
        state["status"] = NOT_FINITE
    elif pq <= 0:
        state["status"] = BREAKDOWN
    else:
        state["alpha"] = state["rz"] / pq


def stop_reason(rnorm, tol, it, maxiter, curvature, finite=True):
    """The stopping rule of every PCG variant (``stop_reason`` in pcg.cu)."""
    if not np.isfinite(rnorm):
        return NOT_FINITE
    if rnorm <= tol:
        return CONVERGED
    if it >= maxiter:
        return MAX_ITERATIONS
    if not (finite and np.isfinite(curvature)):
        return NOT_FINITE
    if curvature <= 0:
        return BREAKDOWN
    return RUNNING


def pcg_update(x, r, q, p0, p1, dinv, state, start=False):
    """x += alpha p; r -= alpha q; z = dinv * r; then decide and set beta (the set-up pass when start)."""
    if not start and state["status"] != RUNNING:
        return None
    p = p0 if state["parity"] else p1
    if not start:
        x += state["alpha"] * p
        r -= state["alpha"] * q
    z = r * dinv if dinv is not None else r.copy()
    classic_decision(state, start, 0 if start else state["iteration"] + 1, r, z)
    return z


def classic_decision(state, start, it, r, z):
    """Classic decision at iteration ``it`` from r.z and ||r|| (``update_decision`` in pcg.cu): the stop
    reason, and while running beta and rz for the next direction (the set-up pass keeps beta 0)."""
    rz_new, rnorm = float(np.dot(r, z)), float(np.linalg.norm(r))
    status = stop_reason(rnorm, state["tol"], it, state["maxiter"], rz_new)
    if status == RUNNING:
        state["beta"] = 0.0 if start else rz_new / state["rz"]
        state["rz"] = rz_new
        if not start:
            state["parity"] ^= 1
    state.update(iteration=it, rnorm=rnorm, status=status)


def split_update(x, r, q, p0, p1, state, r_low=None):
    """x += alpha p; r -= alpha q; r_low = float32(r) when given (``split_update``)."""
    if state["status"] != RUNNING:
        return
    p = p0 if state["parity"] else p1
    x += state["alpha"] * p
    r -= state["alpha"] * q
    if r_low is not None:
        r_low[:] = r.astype(np.float32)


def split_decide(r, z, state):
    """r.z, r.r of the preconditioned residual; decide and set beta (``split_decide``)."""
    if state["status"] != RUNNING:
        return
    start = state["iteration"] < 0
    classic_decision(state, start, state["iteration"] + 1, r, z)


def single_reduction_decision(state, start, it, rnorm, gamma, delta):
    """Chronopoulos-Gear decision (``single_reduction_decision`` in stopping.cu); returns the stop reason."""
    status = stop_reason(rnorm, state["tol"], it, state["maxiter"], gamma, np.isfinite(delta))
    if status != RUNNING:
        return status
    # beta = gamma / rz_old and 1 / alpha_old = pq_old / rz_old, as products with rz_old's reciprocal
    beta = 0.0 if start else gamma * state["rz_inv"]
    pap = delta if start else delta - beta * gamma * (state["pq"] * state["rz_inv"])
    if not np.isfinite(pap):
        return NOT_FINITE
    if pap <= 0:
        return BREAKDOWN
    state.update(beta=beta, alpha=gamma / pap, rz=gamma, rz_inv=1.0 / gamma, pq=pap)
    return RUNNING


def pcg1_step(A, dinv, x, p, r, s, w, state):
    """One single-reduction PCG iteration (of ``pcg1_run``); ``r``, ``s``, ``w`` are buffer pairs.

    s = w + beta s; p = u + beta p (u = M^-1 r, old r); x += alpha p; r -= alpha s;
    u = M^-1 r; w = A u; then decide from r.r, r.u, w.u.
    """
    if state["status"] != RUNNING:
        return
    old, new = state["parity"], 1 - state["parity"]
    alpha, beta = state["alpha"], state["beta"]
    precondition = (lambda v: dinv * v) if dinv is not None else (lambda v: v.copy())
    s[new][:] = beta * s[old] + w[old]
    p[:] = beta * p + precondition(r[old])
    x += alpha * p
    r[new][:] = r[old] - alpha * s[new]
    u = precondition(r[new])
    w[new][:] = A @ u
    it = state["iteration"] + 1
    rnorm = float(np.linalg.norm(r[new]))
    status = single_reduction_decision(state, state["iteration"] < 0, it, rnorm, float(np.dot(r[new], u)),
                                       float(np.dot(w[new], u)))
    if status == RUNNING:
        state["parity"] = new
    state.update(iteration=it, rnorm=rnorm, status=status)


def matrix_residual(A, x, b):
    """b - A x."""
    return b - A @ x
