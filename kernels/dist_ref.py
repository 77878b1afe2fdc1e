"""NumPy meaning of the kernels in ``dist.cu``, field for field of their argument struct.

Each function takes ``a``, an object with the fields of ``struct DistRun``
(``solvers.distributed.gpu.dist_struct``): arrays stand for device pointers
(None for a null pointer), ``a.st`` is the raw bytes of ``struct State`` (a
uint8 array, see :data:`~.structs.STATE`) and ``a.A``, the format's matrix
struct, is the rank's ``n x (n + h)`` block as a SciPy matrix; further kernel
arguments follow ``a``. A test can therefore run them in place of the compiled
kernels, under the same host driver.
"""
import numpy as np

from .pcg_ref import BREAKDOWN, NOT_FINITE, RUNNING, single_reduction_decision, stop_reason
from .structs import STATE


def state(raw):
    """Writable record view of a ``struct State`` held in the uint8 array ``raw``."""
    return raw.view(STATE.dtype)


def dist_pack(a, v0, v1):
    """sendbuf = v[send_index] with v the buffer of (v0, v1) the last update wrote (v1 at parity 0, else v0)."""
    v = v0 if state(a.st)["parity"][0] else v1
    a.sendbuf[:a.nsend] = v[a.send_index[:a.nsend]]


def dist_pack_next_z(a):
    """sendbuf = M^-1 (r - alpha q)[send_index], alpha = rz / reduced[0], r the buffer of (r0, r1) the
    update reads (r1 at parity 1, else r0), unless stopped or that pq is bad."""
    st, pq = state(a.st), float(a.reduced[0])
    if st["status"][0] != RUNNING or not np.isfinite(pq) or pq <= 0:
        return
    r = a.r1 if st["parity"][0] else a.r0
    i = a.send_index[:a.nsend]
    ri = r[i] - st["rz"][0] / pq * a.q[i]
    a.sendbuf[:a.nsend] = a.dinv[i] * ri if a.dinv is not None else ri


def dist_spmv_dot(a):
    """:func:`dist_decide`, then at odd iterations the pending steps x += alpha_prev p_prev, then
    x += alpha p_old (p_prev: what p_new's buffer held; both steps are 0 afterwards); p_new = z +
    beta p_old (owned rows and halo entries); q = A p_new; sums[0] = p_new . q."""
    dist_decide(a)
    st = state(a.st)
    if st["status"][0] != RUNNING:
        return
    A, z, p0, p1, q, x = a.A, a.z, a.p0, a.p1, a.q, a.x
    n, h = A.shape[0], a.h
    p_old, p_new = (p1, p0) if st["parity"][0] else (p0, p1)
    if st["iteration"][0] % 2:
        x[:n] += float(st["alpha_prev"][0]) * p_new[:n]
        x[:n] += float(st["alpha"][0]) * p_old[:n]
        st["alpha_prev"], st["alpha"] = 0.0, 0.0
    p_new[:n + h] = z[:n + h] + float(st["beta"][0]) * p_old[:n + h]
    q[:n] = A @ p_new[:n + h]
    a.sums[0] = float(np.dot(p_new[:n], q[:n]))


def _classic(start, a):
    st = state(a.st)
    if st["status"][0] != RUNNING:
        return
    n, q, z, dinv, sums = a.A.shape[0], a.q, a.z, a.dinv, a.sums[1:3]
    r, r_out = (a.r1, a.r0) if st["parity"][0] else (a.r0, a.r1)
    if not start:
        pq = float(a.reduced[0])
        bad = not np.isfinite(pq) or pq <= 0
        st["alpha_prev"] = st["alpha"]
        st["alpha"] = 0.0 if bad else st["rz"][0] / pq
        if bad:
            st["pq"], st["status"] = pq, (BREAKDOWN if np.isfinite(pq) else NOT_FINITE)
            return
        r_out[:n] = r[:n] - st["alpha"][0] * q[:n]
        r = r_out
    z[:n] = r[:n] * dinv[:n] if dinv is not None else r[:n]
    sums[0], sums[1] = np.dot(r[:n], z[:n]), np.dot(r[:n], r[:n])
    a.pending[0] = 1


def dist_update(a):
    """With pq = reduced[0]: alpha_prev = alpha, then stop on a bad pq (alpha = 0), else alpha =
    rz / pq, r_new = r - alpha q, z = M^-1 r_new (r: r1 at parity 1, else r0; r_new the other);
    sums[1:3] = this rank's r.z, r.r; pending = 1."""
    _classic(False, a)


def dist_start(a):
    """z = M^-1 r (r as in :func:`dist_update`); sums[1:3] = this rank's r.z, r.r; pending = 1."""
    _classic(True, a)


def dist_finish(a):
    """x += alpha_prev p_prev, then x += alpha p (p the current direction, p_prev the other buffer),
    each unless its alpha is 0."""
    st, n = state(a.st), a.A.shape[0]
    p, p_prev = (a.p0, a.p1) if st["parity"][0] else (a.p1, a.p0)
    for alpha, v in ((float(st["alpha_prev"][0]), p_prev), (float(st["alpha"][0]), p)):
        if alpha != 0:
            a.x[:n] += alpha * v[:n]


def _decide(st, history, it, rnorm, status):
    st["iteration"], st["rnorm"], st["status"] = it, rnorm, status
    if history is not None:
        history[it] = rnorm


def dist_decide(a):
    """Classic decision from reduced = [pq, rz_new, rr] (iteration -1: the set-up pass)."""
    st, reduced, pending = state(a.st), a.reduced, a.pending
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
    _decide(st, a.history, it, rnorm, status)


def dist_cg1_step(a):
    """:func:`dist_cg1_decide`, then one Chronopoulos-Gear iteration of ``pcg_ref.pcg1_step``
    over the owned rows, with the halo's copies of r and s (entries n .. n+h of r and s) advanced
    from ``w_halo``; sums[0:3] = this rank's r.r, r.u, w.u; pending = 1."""
    dist_cg1_decide(a)
    st = state(a.st)
    if st["status"][0] != RUNNING:
        return
    A, dinv, x, p, w_halo, sums = a.A, a.dinv, a.x, a.p, a.w_halo, a.sums
    n, h = A.shape[0], a.h
    old = int(st["parity"][0])
    r, s, w = (a.r0, a.r1), (a.s0, a.s1), (a.w0, a.w1)
    alpha, beta = float(st["alpha"][0]), float(st["beta"][0])
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
    a.pending[0] = 1


def dist_cg1_decide(a):
    """Chronopoulos-Gear decision from reduced = [r.r, gamma = r.u, delta = w.u]; the buffers swap
    while running."""
    st, reduced, pending = state(a.st), a.reduced, a.pending
    if st["status"][0] != RUNNING or not pending[0]:
        return
    pending[0] = 0
    start, it = st["iteration"][0] < 0, int(st["iteration"][0]) + 1
    rnorm, gamma, delta = float(np.sqrt(reduced[0])), float(reduced[1]), float(reduced[2])
    fields = {name: st[name][0] for name in STATE.dtype.names}
    status = single_reduction_decision(fields, start, it, rnorm, gamma, delta)
    if status == RUNNING:
        for name in ("beta", "alpha", "rz", "rz_inv", "pq"):
            st[name] = fields[name]
        st["parity"] ^= 1
    _decide(st, a.history, it, rnorm, status)
