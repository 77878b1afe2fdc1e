"""NumPy meaning of the kernels in ``dist.cu``, argument for argument.

Each function takes the kernel's arguments in order: arrays stand for device
pointers (anything else, e.g. ``numpy.uint64(0)``, for a null pointer) and a
``State*`` is the raw bytes of ``struct State`` (a uint8 array, laid out as
``solvers.pcg.gpu.STATE_DTYPE``); the two product kernels take the matrix block
``A`` in place of their ``(rowptr, col, val)``. A test can therefore run them in
place of the compiled kernels, under the same host driver.
"""
import numpy as np

from .pcg_ref import BREAKDOWN, NOT_FINITE, RUNNING, stop_reason


def state(raw):
    """Writable record view of a ``struct State`` held in the uint8 array ``raw``."""
    from solvers.pcg.gpu import STATE_DTYPE
    return raw.view(STATE_DTYPE)


def _ptr(a):
    return a if isinstance(a, np.ndarray) else None


def dist_pack(v0, v1, st, idx, out, m):
    """out = v[idx] with v the buffer of (v0, v1) the last update wrote (v1 at parity 0, else v0)."""
    v = v0 if state(st)["parity"][0] else v1
    out[:m] = v[idx[:m]]


def dist_pack_next_z(r0, r1, q, dinv, st, reduced, idx, out, m):
    """out = M^-1 (r - alpha q)[idx], alpha = rz / reduced[0], r the buffer of (r0, r1) the update
    reads (r1 at parity 1, else r0), unless stopped or that pq is bad."""
    st, pq = state(st), float(reduced[0])
    if st["status"][0] != RUNNING or not np.isfinite(pq) or pq <= 0:
        return
    r = r1 if st["parity"][0] else r0
    i = idx[:m]
    ri = r[i] - st["rz"][0] / pq * q[i]
    dinv = _ptr(dinv)
    out[:m] = dinv[i] * ri if dinv is not None else ri


def dist_spmv_dot(A, z, p0, p1, q, x, st, reduced, pending, history, partials, out, n, h):
    """:func:`dist_decide`, then at odd iterations the pending steps x += alpha_prev p_prev, then
    x += alpha p_old (p_prev: what p_new's buffer held; both steps are 0 afterwards); p_new = z +
    beta p_old (owned rows and halo entries); q = A p_new; *out = p_new . q.

    ``A`` stands for the kernel's (rowptr, col, val): the ``n x (n + h)`` block.
    """
    dist_decide(st, reduced, pending, history)
    st = state(st)
    if st["status"][0] != RUNNING:
        return
    p_old, p_new = (p1, p0) if st["parity"][0] else (p0, p1)
    if st["iteration"][0] % 2:
        x[:n] += float(st["alpha_prev"][0]) * p_new[:n]
        x[:n] += float(st["alpha"][0]) * p_old[:n]
        st["alpha_prev"], st["alpha"] = 0.0, 0.0
    p_new[:n + h] = z[:n + h] + float(st["beta"][0]) * p_old[:n + h]
    q[:n] = A @ p_new[:n + h]
    out[0] = float(np.dot(p_new[:n], q[:n]))


def _classic(start, r0, r1, q, dinv, z, st, reduced, partials, sums, pending, n):
    st = state(st)
    if st["status"][0] != RUNNING:
        return
    r, r_out = (r1, r0) if st["parity"][0] else (r0, r1)
    if not start:
        pq = float(reduced[0])
        bad = not np.isfinite(pq) or pq <= 0
        st["alpha_prev"] = st["alpha"]
        st["alpha"] = 0.0 if bad else st["rz"][0] / pq
        if bad:
            st["pq"], st["status"] = pq, (BREAKDOWN if np.isfinite(pq) else NOT_FINITE)
            return
        r_out[:n] = r[:n] - st["alpha"][0] * q[:n]
        r = r_out
    dinv = _ptr(dinv)
    z[:n] = r[:n] * dinv[:n] if dinv is not None else r[:n]
    sums[0], sums[1] = np.dot(r[:n], z[:n]), np.dot(r[:n], r[:n])
    pending[0] = 1


def dist_update(*args):
    """With pq = reduced[0]: alpha_prev = alpha, then stop on a bad pq (alpha = 0), else alpha =
    rz / pq, r_new = r - alpha q, z = M^-1 r_new (r: r1 at parity 1, else r0; r_new the other);
    sums[0:2] = this rank's r.z, r.r; pending = 1."""
    _classic(False, *args)


def dist_start(*args):
    """z = M^-1 r (r as in :func:`dist_update`); sums[0:2] = this rank's r.z, r.r; pending = 1."""
    _classic(True, *args)


def dist_finish(x, p0, p1, st, n):
    """x += alpha_prev p_prev, then x += alpha p (p the current direction, p_prev the other buffer),
    each unless its alpha is 0."""
    st = state(st)
    p, p_prev = (p0, p1) if st["parity"][0] else (p1, p0)
    for alpha, v in ((float(st["alpha_prev"][0]), p_prev), (float(st["alpha"][0]), p)):
        if alpha != 0:
            x[:n] += alpha * v[:n]


def _decide(st, history, it, rnorm, status):
    st["iteration"], st["rnorm"], st["status"] = it, rnorm, status
    history = _ptr(history)
    if history is not None:
        history[it] = rnorm


def dist_decide(st, reduced, pending, history):
    """Classic decision from reduced = [pq, rz_new, rr] (iteration -1: the set-up pass)."""
    st = state(st)
    if st["status"][0] != RUNNING or not pending[0]:
        return
    pending[0] = 0
    start, it = st["iteration"][0] < 0, int(st["iteration"][0]) + 1
    rz_new, rnorm = float(reduced[1]), float(np.sqrt(reduced[2]))
    status = stop_reason(rnorm, st["tol"][0], it, st["maxiter"][0], rz_new)
    if status == RUNNING:
        st["beta"] = 0.0 if start else rz_new / st["rz"][0]
        st["rz"] = rz_new
        if not start:
            st["parity"] ^= 1
    _decide(st, history, it, rnorm, status)


def dist_cg1_step(A, dinv, x, p, r0, r1, s0, s1, w0, w1, w_halo, st, reduced, pending, history, partials, sums,
                  n, h):
    """:func:`dist_cg1_decide`, then one Chronopoulos-Gear iteration of ``pcg_ref.pcg1_step``
    over the owned rows, with the halo's copies of r and s (entries n .. n+h of r and s) advanced
    from ``w_halo``; sums[0:3] = this rank's r.r, r.u, w.u; pending = 1. ``A`` as in
    :func:`dist_spmv_dot`."""
    dist_cg1_decide(st, reduced, pending, history)
    st = state(st)
    if st["status"][0] != RUNNING:
        return
    old = int(st["parity"][0])
    r, s, w = (r0, r1), (s0, s1), (w0, w1)
    alpha, beta = float(st["alpha"][0]), float(st["beta"][0])
    dinv = _ptr(dinv)
    precondition = (lambda v, k: dinv[:k] * v) if dinv is not None else (lambda v, k: v.copy())
    m = n + h
    w_old = np.concatenate([w[old][:n], w_halo[:h]])
    s[1 - old][:m] = beta * s[old][:m] + w_old
    p[:n] = beta * p[:n] + precondition(r[old][:n], n)
    x[:n] += alpha * p[:n]
    r[1 - old][:m] = r[old][:m] - alpha * s[1 - old][:m]
    u = precondition(r[1 - old][:m], m)
    w[1 - old][:n] = A @ u
    rn, un = r[1 - old][:n], u[:n]
    sums[0], sums[1], sums[2] = np.dot(rn, rn), np.dot(rn, un), np.dot(w[1 - old][:n], un)
    pending[0] = 1


def dist_cg1_decide(st, reduced, pending, history):
    """Chronopoulos-Gear decision from reduced = [r.r, gamma = r.u, delta = w.u]; the buffers swap
    while running."""
    st = state(st)
    if st["status"][0] != RUNNING or not pending[0]:
        return
    pending[0] = 0
    start, it = st["iteration"][0] < 0, int(st["iteration"][0]) + 1
    rnorm, gamma, delta = float(np.sqrt(reduced[0])), float(reduced[1]), float(reduced[2])
    status = stop_reason(rnorm, st["tol"][0], it, st["maxiter"][0], gamma, np.isfinite(delta))
    if status == RUNNING:
        beta = 0.0 if start else gamma / st["rz"][0]
        pap = delta if start else delta - beta * gamma / st["alpha"][0]
        if not np.isfinite(pap):
            status = NOT_FINITE
        elif pap <= 0:
            status = BREAKDOWN
        else:
            st["beta"], st["alpha"], st["rz"], st["pq"] = beta, gamma / pap, gamma, pap
            st["parity"] ^= 1
    _decide(st, history, it, rnorm, status)
