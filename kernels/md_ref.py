"""NumPy statement of what the kernels of ``md.cu`` compute.

The CPU backend of :mod:`solvers.md` is built from these functions, so the GPU
kernels and the CPU reference share one definition of each formula:

======================  ===============================================
kernel code             reference
======================  ===============================================
``philox4x32_10``       :func:`philox4x32` (Philox4x32-10, Random123)
``kick_drift``          :func:`half_kick`, :func:`drift_wrap`,
                        :func:`displacement_sq`
``build_list``          ``solvers.md.neighbor_cpu.build_pairs`` (same
                        pairs, half list)
``force_group``         :func:`lj_pair` (``PairLJ``) or
                        :func:`morse_pair` (``PairMorse``),
                        :func:`langevin_force`, :func:`half_kick`,
                        :func:`thermo_sums`
``md_records``          :func:`migration_records`, :func:`migration_keys`
``md_unpack``           :func:`unpack_records`
``md_ghost_routes``     :func:`route_masks`
``md_bits_*``           :func:`partition_bits` (count, then scatter)
``nlist_index``         :func:`neighbour_slot`
======================  ===============================================

``md_run`` / ``md_run_rebuilding`` take whole steps from these pieces;
``md_force`` and ``md_neigh_build*`` run them between launches.
"""
import numpy as np

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_MASK = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
# Third counter word: names the stream, so other uses of the generator never collide.
LANGEVIN_STREAM = 0x4C414E47  # "LANG"


def philox4x32(c0, c1, c2, c3, k0, k1, rounds=10):
    """Philox4x32-10 counter-based generator, element-wise.

    Parameters
    ----------
    c0, c1, c2, c3 : array_like of uint32
        Counter words.
    k0, k1 : int
        Key words (the seed).

    Returns
    -------
    tuple of 4 ndarray of uint64
        The four 32-bit outputs (stored in uint64).
    """
    c = [np.asarray(w, dtype=np.uint64) & _MASK for w in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(k0) & _MASK, np.uint64(k1) & _MASK
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
        p0, p1 = _M0 * c[0], _M1 * c[2]
        c = [((p1 >> _S32) ^ c[1] ^ k0) & _MASK, p1 & _MASK,
             ((p0 >> _S32) ^ c[3] ^ k1) & _MASK, p0 & _MASK]
    return tuple(c)


def uniform_centered(bits):
    """Map 32-bit integers to doubles in (-0.5, 0.5), as the kernel does."""
    return (bits.astype(np.float64) + 0.5) * 2.0 ** -32 - 0.5


def langevin_uniform(ids, step, seed):
    """Three centred uniforms per particle for Langevin step ``step``.

    Counter (id, step low, step high, stream), key (seed low, seed high).

    Returns
    -------
    ndarray, shape (N, 3)
    """
    ids = np.asarray(ids, dtype=np.uint64)
    step, seed = int(step), int(seed)
    r = philox4x32(ids, np.uint64(step & 0xFFFFFFFF), np.uint64(step >> 32),
                   np.uint64(LANGEVIN_STREAM), seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
    return np.stack([uniform_centered(r[k]) for k in range(3)], axis=1)


def langevin_force(v, ids, step, mass, kt, damp, dt, seed):
    """Langevin force as LAMMPS ``fix langevin`` defines it.

    ``F = -m v / damp + sqrt(24 kT m / (damp dt)) u`` with ``u`` uniform in
    (-0.5, 0.5) (variance 1/12, hence the 24).
    """
    scale = np.sqrt(24.0 * kt * mass / (damp * dt))
    return -(mass / damp) * v + scale * langevin_uniform(ids, step, seed)


def half_kick(v, f, mass, dt):
    """``v + dt/2 f/m`` (both halves of velocity Verlet)."""
    return v + (0.5 * dt / mass) * f


def drift_wrap(x, v, img, box, dt):
    """Drift ``x += dt v`` and wrap into ``[0, box)``, counting image crossings.

    Returns
    -------
    (x, img, step_sq)
        New wrapped positions, image counts, and the squared move of each particle.
    """
    dx = dt * v
    x = x + dx
    hi, lo = x >= box, x < 0.0
    np.subtract(x, box, out=x, where=hi)
    np.add(x, box, out=x, where=lo)
    # x + L can round up to exactly L: that point is 0 again.
    x[x >= box] = 0.0
    img = img + hi
    img -= lo
    return x, img, np.einsum("ij,ij->i", dx, dx)


def neighbour_slot(g, s, rows, tpp):
    """Where slot ``s`` of particle (lane group) ``g``'s neighbour list lies among ``rows`` lists,
    ``tpp`` lanes a particle: runs of ``tpp`` slots, one particle's run after another's."""
    return ((s // tpp) * rows + g) * tpp + s % tpp


def minimum_image(d, box):
    """Shortest periodic image of the separations ``d`` (..., 3)."""
    return d - box * np.rint(d / box)


def displacement_sq(x, hold, box):
    """Squared displacement since the last neighbour-list build, minimum image."""
    d = minimum_image(x - hold, box)
    return np.einsum("ij,ij->i", d, d)


def _scratch(rsq, work, k):
    """``k`` arrays of ``rsq``'s shape: rows of ``work`` when given (no allocation), else new ones."""
    if work is None:
        return [np.empty(np.shape(rsq)) for _ in range(k)]
    return [work[r] for r in range(k)]


def lj_pair(rsq, epsilon, sigma, eshift, energy=True, rc_sq=np.inf, work=None):
    """Lennard-Jones pair terms for squared distances ``rsq`` (> 0), zero at and beyond ``rc_sq``.

    Parameters
    ----------
    rsq : ndarray
    epsilon, sigma, eshift : float
    energy : bool
    rc_sq : float
        Squared cutoff (none by default).
    work : ndarray, shape (3,) + rsq.shape, optional
        Room to compute in: without ``energy`` nothing is allocated and ``F/r`` is
        returned in ``work[0]`` (the NumPy backend calls this on blocks of pairs every step).

    Returns
    -------
    (fr, e, w)
        ``F/r`` (force on j along r_j - r_i divided by r), the pair energy
        ``4 eps ((s/r)^12 - (s/r)^6) - eshift``, and the pair virial ``r . F``;
        ``e`` and ``w`` are None unless ``energy``.
    """
    fr, inv, inv3 = _scratch(rsq, work, 3)
    # 1/r^2 inside the cutoff and 0 beyond it, so that every term below is 0 there.
    np.less(rsq, rc_sq, out=inv)
    np.divide(inv, rsq, out=inv)
    np.multiply(inv, inv, out=inv3)
    inv3 *= inv
    # F/r = 24 eps (2 s^12 / r^14 - s^6 / r^8), in place from 1/r^6 and 1/r^2.
    s6 = sigma ** 6
    np.multiply(inv3, 48.0 * epsilon * s6 * s6, out=fr)
    fr -= 24.0 * epsilon * s6
    fr *= inv3
    fr *= inv
    if not energy:
        return fr, None, None
    sr6 = s6 * inv3
    e = sr6 - 1.0
    e *= sr6
    e *= 4.0 * epsilon
    e -= eshift * (rsq < rc_sq)
    return fr, e, fr * rsq


def morse_pair(rsq, d0, alpha, r0, eshift, energy=True, rc_sq=np.inf, work=None):
    """Morse pair terms (LAMMPS ``pair_style morse``) for squared distances ``rsq``, zero at and beyond ``rc_sq``.

    ``U(r) = D0 (exp(-2 a (r - r0)) - 2 exp(-a (r - r0))) - eshift``.

    Parameters and returns are those of :func:`lj_pair` (``work`` of shape (2,) + rsq.shape).
    """
    fr, ex = _scratch(rsq, work, 2)
    inside = rsq < rc_sq
    r = np.sqrt(rsq)
    np.subtract(r, r0, out=ex)
    ex *= -alpha
    np.exp(ex, out=ex)
    # r . F = 2 a D0 ex (ex - 1) r
    np.subtract(ex, 1.0, out=fr)
    fr *= ex
    fr *= r
    fr *= 2.0 * alpha * d0
    fr *= inside
    w = fr.copy() if energy else None
    fr /= rsq
    if not energy:
        return fr, None, None
    e = ex - 2.0
    e *= ex
    e *= d0
    e -= eshift
    e *= inside
    return fr, e, w


def thermo_sums(v, mass, pe_atom, vir_atom):
    """The three sums md_force reduces at a chunk's end: sum m v^2, sum E_pair, sum r.F."""
    return float(mass * np.einsum("ij,ij->", v, v)), float(np.sum(pe_atom)), float(np.sum(vir_atom))


# Distributed runs (``RankFrame`` in md_params): the columns of a migration record.
RECORD_POSITION, RECORD_VELOCITY, RECORD_IMAGE, RECORD_INDEX, RECORD_ID, RECORD_OWNER, RECORD = 0, 3, 6, 9, 10, 11, 12
# Migration keys: 0 stays, 1 + r goes along route r, LOST has no neighbour to go to (MIGRATION_KEYS in all).
LOST = 27
MIGRATION_KEYS = LOST + 1


def migration_records(x, v, img, index, ids, origin, box, width, grid):
    """Records (n, RECORD) of the particles at frame positions ``x``: wrapped global position, velocity,
    image counts, ``index``, ``ids`` and the rank owning the position in a ``grid`` of sub-boxes ``width`` wide."""
    q = np.asarray(x, np.float64)[:, :3] + origin
    wraps = np.floor(q / box)
    q -= wraps * box
    cell = np.clip(np.floor(q / width).astype(np.int64), 0, np.asarray(grid) - 1)
    rec = np.empty((len(q), RECORD))
    rec[:, 0:3] = q
    rec[:, 3:6] = np.asarray(v)[:, :3]
    rec[:, 6:9] = np.asarray(img)[:, :3] + wraps
    rec[:, RECORD_INDEX] = index
    rec[:, RECORD_ID] = ids
    rec[:, RECORD_OWNER] = (cell[:, 0] * grid[1] + cell[:, 1]) * grid[2] + cell[:, 2]
    return rec


def migration_keys(rec, coords, grid, offsets):
    """Bit key set per record: 0 if its owner is the rank at ``coords``, 1 + r if the owner is the neighbour
    at ``offsets[r]`` (a 3-vector of -1, 0, +1; the shorter way round the periodic grid), LOST otherwise."""
    grid = np.asarray(grid)
    owner = rec[:, RECORD_OWNER].astype(np.int64)
    cell = np.stack([owner // (grid[1] * grid[2]), owner // grid[2] % grid[1], owner % grid[2]], axis=1)
    step = cell - np.asarray(coords)
    step = np.where((grid > 2) & (step == grid - 1), -1, np.where((grid > 2) & (step == 1 - grid), 1, step))
    key = np.zeros(len(rec), np.int64)
    for r, offset in enumerate(offsets):
        key[(step == offset).all(axis=1)] = 1 + r
    key[(np.abs(step) > 1).any(axis=1)] = LOST
    return (np.uint32(1) << key.astype(np.uint32)).astype(np.uint32)


def unpack_records(rec, origin, real=np.float64):
    """``(x, v, img, index, ids)`` of records, positions in the frame at ``origin`` (in ``real``)."""
    return ((rec[:, 0:3] - origin).astype(real), rec[:, 3:6].astype(real), rec[:, 6:9].astype(np.int32),
            rec[:, RECORD_INDEX].astype(np.int64), rec[:, RECORD_ID].astype(np.int64))


def route_masks(x, lo, hi, reach, offsets, xp=np):
    """Bit r set where the global position ``x`` (n, 3) lies within ``reach`` of every face of the box
    [lo, hi) that ``offsets[r]`` points through (a 3-vector of -1, 0, +1; 0 for none)."""
    near_lo = x - xp.asarray(lo) < reach
    near_hi = xp.asarray(hi) - x < reach
    mask = xp.zeros(len(x), xp.uint32)
    for r, offset in enumerate(offsets):
        ok = xp.ones(len(x), dtype=bool)
        for d, o in enumerate(offset):
            if o:
                ok &= (near_lo if o < 0 else near_hi)[:, d]
        mask |= ok.astype(xp.uint32) << r
    return mask


def partition_bits(mask, nkeys, xp=np):
    """``(index, key)`` of every set bit k < ``nkeys`` of the masks ``mask`` (N,): grouped by key, indices
    ascending within a key. Items with no bit set are dropped first; the others' bits are expanded into a
    (keys, items) table whose set entries, in row order, are the pairs."""
    cand = xp.flatnonzero(mask)
    m = len(cand)
    if m == 0:
        return cand, xp.zeros(0, xp.int64)
    bits = (mask[cand][None, :] >> xp.arange(nkeys, dtype=xp.uint32)[:, None]) & 1
    flat = xp.flatnonzero(bits)
    return cand[flat % m], flat // m
