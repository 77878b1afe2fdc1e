"""NumPy meaning of the kernels in ``amg_setup.cu`` (smoothed-aggregation set-up).

Each function takes and returns what its kernel does, on the same CSR arrays
(``indptr``, ``indices``, ``values``) and with the same integer results, so the
set-up run with these functions aggregates exactly as the device does.
"""
import numpy as np

OUT, UNDECIDED, ROOT = 0, 1, 2
_STATE_SHIFT = np.uint64(62)
_LOW32 = np.uint64(0xFFFFFFFF)
_WITHOUT_STATE = np.uint64(0x3FFFFFFFFFFFFFFF)


def _rows(indptr):
    """The row of every CSR entry."""
    return np.repeat(np.arange(indptr.size - 1), np.diff(indptr))


def node_hash(i, seed):
    """``node_hash``: MurmurHash3's 32-bit finaliser of ``i * 0x9E3779B1 ^ seed`` (uint32, wrapping).

    ``i`` is an integer array, NumPy or CuPy: the same bits either way.
    """
    h = (i.astype(np.uint32) * np.uint32(0x9E3779B1)) ^ np.uint32(seed)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def key_state(keys):
    """The MIS state (``OUT``, ``UNDECIDED``, ``ROOT``) in bits 62-63 of the keys."""
    return (keys >> _STATE_SHIFT).astype(np.int64)


def strong_connections(indptr, indices, values, diagonal, theta):
    """``strong_connections``: ``(i, j)`` is strong if ``i != j``, ``a_ij != 0`` and ``a_ij^2 >= theta^2 |d_i d_j|``."""
    rows = _rows(indptr)
    d = np.abs(diagonal)
    return (indices != rows) & (values != 0) & (values * values >= (theta * theta) * d[rows] * d[indices])


def mis_initial_keys(indptr, strong, seed):
    """``mis_initial_keys``: ``(state, 30-bit hash, index)`` packed in uint64, isolated nodes out."""
    n = indptr.size - 1
    has_neighbour = np.bincount(_rows(indptr)[strong], minlength=n) > 0
    state = np.where(has_neighbour, UNDECIDED, OUT).astype(np.uint64)
    index = np.arange(n, dtype=np.uint64)
    hashed = (node_hash(np.arange(n), seed) & np.uint32(0x3FFFFFFF)).astype(np.uint64)
    return (state << _STATE_SHIFT) | (hashed << np.uint64(32)) | index


def neighbourhood_max(indptr, indices, strong, keys):
    """``neighbourhood_max``: the largest key among each node and its strong neighbours."""
    out = keys.copy()
    np.maximum.at(out, _rows(indptr)[strong], keys[indices[strong]])
    return out


def mis_decide(reach, keys):
    """``mis_decide``: new keys after one round, from the distance-2 maxima ``reach``."""
    keys = keys.copy()
    undecided = key_state(keys) == UNDECIDED
    own = (reach & _LOW32) == np.arange(keys.size, dtype=np.uint64)
    becomes_root = undecided & own
    becomes_out = undecided & ~own & (key_state(reach) == ROOT)
    keys[becomes_root] = (np.uint64(ROOT) << _STATE_SHIFT) | (keys[becomes_root] & _WITHOUT_STATE)
    keys[becomes_out] &= _WITHOUT_STATE
    return keys


def join_roots(indptr, indices, strong, keys, root_number):
    """``join_roots``: a root's number for roots and their strong neighbours, -1 elsewhere."""
    is_root = key_state(keys) == ROOT
    aggregate = np.where(is_root, root_number, -1).astype(np.int32)
    rows = _rows(indptr)
    next_to_root = strong & is_root[indices] & ~is_root[rows]
    aggregate[rows[next_to_root]] = root_number[indices[next_to_root]]
    return aggregate


def join_neighbours(indptr, indices, strong, first):
    """``join_neighbours``: unaggregated nodes take their strong neighbours' largest aggregate in ``first``."""
    best = np.full(first.size, -1, dtype=np.int32)
    np.maximum.at(best, _rows(indptr)[strong], first[indices[strong]])
    return np.where(first >= 0, first, best).astype(np.int32)


def fit_candidates(offsets, q, k, tol):
    """``fit_candidates``: modified Gram-Schmidt of each aggregate's rows of ``q`` (in place) and its R.

    Parameters
    ----------
    offsets : ndarray of int
        Aggregate ``a`` owns rows ``offsets[a]`` to ``offsets[a+1] - 1`` of ``q``.
    q : ndarray, shape (rows, k)
        The near-nullspace's rows, aggregate after aggregate; overwritten with Q.
    tol : float
        A column whose norm after orthogonalisation is at most ``tol`` times its norm before is zeroed.

    Returns
    -------
    ndarray, shape (aggregates, k, k)
        The upper triangular factors R.
    """
    r = np.zeros((offsets.size - 1, k, k))
    for a in range(offsets.size - 1):
        block = q[offsets[a]:offsets[a + 1]]
        for j in range(k):
            threshold = tol * np.sqrt(block[:, j] @ block[:, j])
            for c in range(j):
                dot = block[:, c] @ block[:, j]
                block[:, j] -= dot * block[:, c]
                r[a, c, j] = dot
            norm = np.sqrt(block[:, j] @ block[:, j])
            keep = norm > threshold
            r[a, j, j] = norm if keep else 0.0
            block[:, j] *= 1.0 / norm if keep else 0.0
    return r


def smooth_prolongator(x_indptr, x_indices, x_values, factor, t_indptr, t_indices, t_values):
    """``smooth_prolongator``: the values of ``T + diag(factor) X`` on the pattern of ``X`` (which holds ``T``'s)."""
    n_cols = int(max(x_indices.max(initial=-1), t_indices.max(initial=-1))) + 1
    x_keys = _rows(x_indptr).astype(np.int64) * n_cols + x_indices
    t_keys = _rows(t_indptr).astype(np.int64) * n_cols + t_indices
    order = np.argsort(x_keys, kind="stable")
    at = order[np.minimum(np.searchsorted(x_keys[order], t_keys), max(x_keys.size - 1, 0))]
    if not np.array_equal(x_keys[at], t_keys):
        raise ValueError("a column of T is missing from the pattern of A T (A's diagonal is not stored)")
    values = x_values * factor[_rows(x_indptr)]
    np.add.at(values, at, t_values)
    return values
