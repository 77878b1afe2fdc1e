"""NumPy meaning of the kernels in ``dist.cu``, argument for argument.

Each function takes the kernel's arguments in order: arrays stand for device
pointers (anything else, e.g. ``numpy.uint64(0)``, for a null pointer) and a
``State*`` is the raw bytes of ``struct State`` (a uint8 array, laid out as
``solvers.pcg.gpu.STATE_DTYPE``). A test can therefore run them in place of
the compiled kernels, under the same host driver.
"""
import numpy as np

from .pcg_ref import BREAKDOWN, NOT_FINITE, RUNNING, stop_reason


def state(raw):
    """Writable record view of a ``struct State`` held in the uint8 array ``raw``."""
    from solvers.pcg.gpu import STATE_DTYPE
    return raw.view(STATE_DTYPE)


def _ptr(a):
    return a if isinstance(a, np.ndarray) else None


def dist_pack(v, idx, out, st, sh, m):
    """out = v[idx]; sh takes st's status with beta 0 and parity 0."""
    st, sh = state(st), state(sh)
    out[:m] = v[idx[:m]]
    sh["status"], sh["beta"], sh["parity"] = st["status"], 0.0, 0


def dist_halo_direction(hz, hp, st, m):
    """hp = hz + beta hp (classic direction on the halo)."""
    hp[:m] = hz[:m] + float(state(st)["beta"][0]) * hp[:m]


def dist_halo_spmv(hptr, hcol, hval, rows, h, y, sign, p0, p1, st, sh, partials, out, nb):
    """y[rows] += sign * H h; with out, *out = sh.pq + v[rows] . (H h) (v the direction just multiplied)."""
    st, sh, out = state(st), state(sh), _ptr(out)
    if out is not None and st["status"][0] != RUNNING:
        return
    s = np.array([np.dot(hval[hptr[i]:hptr[i + 1]], h[hcol[hptr[i]:hptr[i + 1]]]) for i in range(nb)],
                 dtype=y.dtype)
    y[rows[:nb]] += sign * s
    if out is not None:
        v = p0 if sh["parity"][0] else p1
        out[0] = sh["pq"][0] + float(np.dot(v[rows[:nb]].astype(np.float64), s))


def _classic(start, x, r, q, p0, p1, dinv, z, st, sh, reduced, partials, sums, pending, n):
    st = state(st)
    if st["status"][0] != RUNNING:
        return
    if not start:
        pq = float(reduced[0])
        if not np.isfinite(pq) or pq <= 0:
            st["pq"], st["status"] = pq, (BREAKDOWN if np.isfinite(pq) else NOT_FINITE)
            return
        alpha = st["rz"][0] / pq
        p = p0 if st["parity"][0] else p1
        x[:n] += alpha * p[:n]
        r[:n] -= alpha * q[:n]
    dinv = _ptr(dinv)
    z[:n] = r[:n] * dinv[:n] if dinv is not None else r[:n]
    sums[0], sums[1] = np.dot(r[:n], z[:n]), np.dot(r[:n], r[:n])
    pending[0] = 1


def dist_update(*args):
    """With pq = reduced[0]: stop on a bad pq, else x += alpha p, r -= alpha q, z = M^-1 r;
    sums[0:2] = this rank's r.z, r.r; pending = 1."""
    _classic(False, *args)


def dist_start(*args):
    """z = M^-1 r; sums[0:2] = this rank's r.z, r.r; pending = 1."""
    _classic(True, *args)


def _decide(st, history, it, rnorm, status):
    st["iteration"], st["rnorm"], st["status"] = it, rnorm, status
    history = _ptr(history)
    if history is not None:
        history[it] = rnorm


def dist_decide(st, sh, reduced, pending, history):
    """Classic decision from reduced = [pq, rz_new, rr] (iteration -1: the set-up pass);
    then sh takes st's status, beta and parity."""
    st, sh = state(st), state(sh)
    if st["status"][0] == RUNNING and pending[0]:
        _classic_decision(st, reduced, pending, history)
    sh["status"], sh["beta"], sh["parity"] = st["status"], st["beta"], st["parity"]


def _classic_decision(st, reduced, pending, history):
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


def _cg1(start, x, r, u, w, p, s, dinv, st, sh, partials, sums, pending, n):
    st = state(st)
    if st["status"][0] != RUNNING:
        return
    if not start:
        alpha, beta = st["alpha"][0], st["beta"][0]
        p[:n] = u[:n] + beta * p[:n]
        s[:n] = w[:n] + beta * s[:n]
        x[:n] += alpha * p[:n]
        r[:n] -= alpha * s[:n]
    dinv = _ptr(dinv)
    u[:n] = r[:n] * dinv[:n] if dinv is not None else r[:n]
    sums[0], sums[1] = np.dot(r[:n], r[:n]), np.dot(r[:n], u[:n])
    pending[0] = 1


def dist_cg1_update(*args):
    """p = u + beta p, s = w + beta s, x += alpha p, r -= alpha s, u = M^-1 r;
    sums[0:2] = this rank's r.r, r.u; pending = 1."""
    _cg1(False, *args)


def dist_cg1_start(*args):
    """u = M^-1 r; sums[0:2] = this rank's r.r, r.u; pending = 1."""
    _cg1(True, *args)


def dist_cg1_decide(st, reduced, pending, history):
    """Chronopoulos-Gear decision from reduced = [r.r, gamma = r.u, delta = w.u]."""
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
    _decide(st, history, it, rnorm, status)
