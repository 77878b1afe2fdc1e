"""Compiled kernels of the CPU backend's mode ``numba``: Verlet-list build, pair forces, integration.

They compute what the NumPy reference computes (:mod:`.neighbor_cpu`, :mod:`.cpu` and the
formulas of :mod:`solvers.kernels.md_ref`), in compiled loops instead of whole-array passes:

- :func:`verlet_list`: the pairs of :func:`~.neighbor_cpu.build_pairs`, with their images
  numbered as :class:`~.neighbor_cpu.CandidatePairs` numbers them, from a cell list (bins at
  least half the list cutoff wide, each atom against the bins within the cutoff, each pair
  of bins and of atoms looked at once); each row's pairs in the order found;
- :func:`pair_forces`: forces, and halves of pair energy and virial, in one pass over the
  rows of a half list; the pair terms are those of ``md_ref.lj_pair`` and
  ``md_ref.morse_pair`` to the bit, only the order of the sums differs;
- :func:`kick_drift` and :func:`half_kick`: the two halves of a velocity-Verlet step, one
  pass over the particles each.

One thread, float64. Compiled at first use and cached beside this file (or in Numba's
cache directory where that is not writable).
"""
import numba
import numpy as np

from .neighbor_cpu import NO_SHIFT, PairList, image_shifts

_LJ, _MORSE = 0, 1
# Bins of the cell list: at least the list cutoff over this wide, each atom against the bins within the cutoff
# (fewer pairs of atoms looked at than with bins of the cutoff, 27 of them, for more but shorter runs).
BINS_PER_CUTOFF = 2


def _params(potential):
    """Kernel code and parameters of ``potential`` (the constants ``md_ref`` forms, formed alike)."""
    if potential.name == "lj":
        s6 = potential.sigma ** 6
        return _LJ, np.array([48.0 * potential.epsilon * s6 * s6, 24.0 * potential.epsilon * s6,
                              4.0 * potential.epsilon, s6, potential.energy_shift])
    if potential.name == "morse":
        return _MORSE, np.array([potential.d0, potential.alpha, potential.r0, potential.energy_shift, 0.0])
    raise ValueError(f"no compiled pair terms for potential {potential.name!r}")


@numba.njit(cache=True, inline="always")
def _pair_terms(kind, p, rsq, energy):
    """``(F/r, energy, r.F)`` of one pair inside the cutoff (energy and r.F only with ``energy``)."""
    if kind == _LJ:
        inv = 1.0 / rsq
        inv3 = inv * inv * inv
        fr = (inv3 * p[0] - p[1]) * inv3 * inv
        if not energy:
            return fr, 0.0, 0.0
        sr6 = p[3] * inv3
        return fr, (sr6 - 1.0) * sr6 * p[2] - p[4], fr * rsq
    r = np.sqrt(rsq)
    ex = np.exp((r - p[2]) * -p[1])
    w = (ex - 1.0) * ex * r * (2.0 * p[1] * p[0])
    if not energy:
        return w / rsq, 0.0, 0.0
    return w / rsq, (ex - 2.0) * ex * p[0] - p[3], w


@numba.njit(cache=True)
def _forces(kind, p, rc_sq, y, image_source, image_shift, offsets, j, n_out, energy):
    n = y.shape[0]
    n_all = n + image_source.shape[0]
    ya = np.empty((n_all, 3))
    ya[:n] = y
    for g in range(image_source.shape[0]):
        for k in range(3):
            ya[n + g, k] = y[image_source[g], k] + image_shift[g, k]
    f = np.zeros((n_all, 3))
    halves = np.zeros((n_all, 2))
    for i in range(offsets.shape[0] - 1):
        xi, yi, zi = ya[i, 0], ya[i, 1], ya[i, 2]
        fx = fy = fz = 0.0
        ei = wi = 0.0
        for q in range(offsets[i], offsets[i + 1]):
            a = j[q]
            dx, dy, dz = ya[a, 0] - xi, ya[a, 1] - yi, ya[a, 2] - zi
            rsq = dx * dx + dy * dy + dz * dz
            # Every pair's terms, then zeroed beyond the cutoff: a liquid's pairs fall either side of it
            # at random, and a branch on it would be mispredicted about every fourth pair.
            fr, e, w = _pair_terms(kind, p, rsq, energy)
            inside = rsq < rc_sq
            fr = fr if inside else 0.0
            dx *= fr
            dy *= fr
            dz *= fr
            fx += dx
            fy += dy
            fz += dz
            f[a, 0] += dx
            f[a, 1] += dy
            f[a, 2] += dz
            if energy:
                e = 0.5 * e if inside else 0.0
                w = 0.5 * w if inside else 0.0
                ei += e
                wi += w
                halves[a, 0] += e
                halves[a, 1] += w
        f[i, 0] -= fx
        f[i, 1] -= fy
        f[i, 2] -= fz
        halves[i, 0] += ei
        halves[i, 1] += wi
    for g in range(image_source.shape[0]):
        s = image_source[g]
        for k in range(3):
            f[s, k] += f[n + g, k]
        halves[s, 0] += halves[n + g, 0]
        halves[s, 1] += halves[n + g, 1]
    return f[:n_out].copy(), halves[:n_out, 0].copy(), halves[:n_out, 1].copy()


def pair_forces(pairs, y, potential, n_out, energy=False):
    """:meth:`PairList.compute <.neighbor_cpu.PairList.compute>` in one compiled pass over the list."""
    kind, p = _params(potential)
    f, pe, vir = _forces(kind, p, potential.rc * potential.rc, np.ascontiguousarray(y, np.float64),
                         pairs.image_source, np.ascontiguousarray(pairs.image_shift, np.float64),
                         pairs.offsets, pairs.j, n_out, energy)
    return (f, pe, vir) if energy else (f, None, None)


@numba.njit(cache=True)
def _edge_neighbours(bins, width):
    """Along one edge of ``bins`` bins of ``width`` (at least the cutoff over ``BINS_PER_CUTOFF``): for
    each bin the distinct bins within ``BINS_PER_CUTOFF`` of it (periodic), their count, the shift in
    boxes that brings each one's atoms nearest, and the gap between the two bins (shift and gap 0
    where there are too few bins for them to be the same for every pair: worked out pair by pair)."""
    reach = BINS_PER_CUTOFF
    span = 2 * reach + 1
    exact = bins >= span
    out = np.empty((bins, span), np.int64)
    shift = np.zeros((bins, span), np.int64)
    gap = np.zeros((bins, span))
    count = np.empty(bins, np.int64)
    for c in range(bins):
        m = 0
        for s in range(-reach, reach + 1):
            d = (c + s) % bins
            seen = False
            for t in range(m):
                seen |= out[c, t] == d
            if not seen:
                out[c, m] = d
                if exact:
                    shift[c, m] = (c + s - d) // bins
                    gap[c, m] = max(abs(s) - 1, 0) * width
                m += 1
        count[c] = m
    return out, shift, gap, count


@numba.njit(cache=True, inline="always")
def _nearest(d, length, exact):
    """Separation ``d`` along an edge of ``length`` taken to the nearest image, and the image's shift in
    boxes (``exact``: the bins' shift has done so already)."""
    if exact:
        return d, 0
    if d < -0.5 * length:
        return d + length, 1
    if d > 0.5 * length:
        return d - length, -1
    return d, 0


@numba.njit(cache=True)
def _by_key(key, n):
    """Order of a stable counting sort of ``key`` (values below ``n``), and the counts of each value."""
    counts = np.zeros(n, np.int64)
    for k in key:
        counts[k] += 1
    place = np.empty(n, np.int64)
    total = 0
    for v in range(n):
        place[v] = total
        total += counts[v]
    order = np.empty(key.shape[0], np.int64)
    for p in range(key.shape[0]):
        order[place[key[p]]] = p
        place[key[p]] += 1
    return order, counts


@numba.njit(cache=True)
def _cell_list_pairs(x, box, rlist, nc, capacity):
    """Pairs ``i < j`` at most ``rlist`` apart (nearest image) in rows of ``i``, from ``nc`` bins along each
    edge (each at least ``rlist / BINS_PER_CUTOFF`` wide): the rows' counts, ``j`` (an atom, or an image
    numbered from ``n``) and the images' keys (27 source + image code)."""
    n = x.shape[0]
    cell = np.empty(n, np.int64)
    for a in range(n):
        c = 0
        for k in range(3):
            c = c * nc[k] + min(int(x[a, k] / box[k] * nc[k]), nc[k] - 1)
        cell[a] = c
    n_cells = nc[0] * nc[1] * nc[2]
    order, per_cell = _by_key(cell, n_cells)
    start = np.zeros(n_cells + 1, np.int64)
    for c in range(n_cells):
        start[c + 1] = start[c] + per_cell[c]
    xs = np.empty((n, 3))  # positions in bin order: the inner loop reads them in sequence
    for s in range(n):
        xs[s] = x[order[s]]
    nb0, sh0, gap0, cnt0 = _edge_neighbours(nc[0], box[0] / nc[0])
    nb1, sh1, gap1, cnt1 = _edge_neighbours(nc[1], box[1] / nc[1])
    nb2, sh2, gap2, cnt2 = _edge_neighbours(nc[2], box[2] / nc[2])
    span = 2 * BINS_PER_CUTOFF + 1
    ex0, ex1, ex2 = nc[0] >= span, nc[1] >= span, nc[2] >= span
    L0, L1, L2 = box[0], box[1], box[2]
    rsq_max = rlist * rlist
    # Each pair of bins once (the other bin after home, or home itself), each pair of atoms once.
    found_i = np.empty(capacity, np.int64)
    found_j = np.empty(capacity, np.int64)
    found_code = np.empty(capacity, np.int8)
    others = np.empty(span ** 3, np.int64)
    bases = np.empty((span ** 3, 4), np.int64)  # each bin's shift in boxes (x, y, z) and its image code
    total = 0
    for c0 in range(nc[0]):
        for c1 in range(nc[1]):
            for c2 in range(nc[2]):
                home = (c0 * nc[1] + c1) * nc[2] + c2
                # The bins worth looking in: after home, and not farther than rlist from it.
                m = 0
                reach = 0
                for u in range(cnt0[c0]):
                    for v in range(cnt1[c1]):
                        for w in range(cnt2[c2]):
                            other = (nb0[c0, u] * nc[1] + nb1[c1, v]) * nc[2] + nb2[c2, w]
                            if other < home or gap0[c0, u] ** 2 + gap1[c1, v] ** 2 + gap2[c2, w] ** 2 > rsq_max:
                                continue
                            others[m] = other
                            bases[m, 0] = sh0[c0, u]
                            bases[m, 1] = sh1[c1, v]
                            bases[m, 2] = sh2[c2, w]
                            bases[m, 3] = NO_SHIFT + sh0[c0, u] + 3 * sh1[c1, v] + 9 * sh2[c2, w]
                            reach += per_cell[other]
                            m += 1
                for s in range(start[home], start[home + 1]):
                    if total + reach > found_j.shape[0]:  # grown here, outside the loops over pairs
                        grow = max(found_j.shape[0], reach)
                        found_i = np.concatenate((found_i, np.empty(grow, np.int64)))
                        found_j = np.concatenate((found_j, np.empty(grow, np.int64)))
                        found_code = np.concatenate((found_code, np.empty(grow, np.int8)))
                    a = order[s]
                    for q in range(m):
                        other = others[q]
                        # The home atom moved by the bin's shift, so that the other bin's atoms are nearest.
                        xa = xs[s, 0] - bases[q, 0] * L0
                        ya = xs[s, 1] - bases[q, 1] * L1
                        za = xs[s, 2] - bases[q, 2] * L2
                        first = s + 1 if other == home else start[other]
                        for t in range(first, start[other + 1]):
                            dx, sx = _nearest(xs[t, 0] - xa, L0, ex0)
                            dy, sy = _nearest(xs[t, 1] - ya, L1, ex1)
                            dz, sz = _nearest(xs[t, 2] - za, L2, ex2)
                            # Written whether or not the pair is close enough, kept only if it is: no branch
                            # to mispredict on the one condition that is neither mostly true nor mostly false.
                            b = order[t]
                            code = bases[q, 3] + sx + 3 * sy + 9 * sz
                            # As a pair (i, j) with i < j: seen from j, the image shift is reversed.
                            found_i[total] = min(a, b)
                            found_j[total] = max(a, b)
                            found_code[total] = code if a < b else 26 - code
                            total += dx * dx + dy * dy + dz * dz <= rsq_max
    # In rows of i (a counting sort; a row's pairs stay in the order they were found), and the images
    # numbered in the order of (source, image code), as neighbor_cpu._with_images numbers them.
    counts = np.zeros(n, np.int64)
    used = np.zeros(27 * n, np.bool_)
    for p in range(total):
        counts[found_i[p]] += 1
        if found_code[p] != NO_SHIFT:
            used[found_j[p] * 27 + found_code[p]] = True
    number = np.empty(27 * n, np.int64)
    images = 0
    for key in range(27 * n):
        if used[key]:
            number[key] = n + images
            images += 1
    image_keys = np.empty(images, np.int64)
    for key in range(27 * n):
        if used[key]:
            image_keys[number[key] - n] = key
    place = np.empty(n, np.int64)
    p = 0
    for i in range(n):
        place[i] = p
        p += counts[i]
    js = np.empty(total, np.int64)
    for p in range(total):
        i = found_i[p]
        q = place[i]
        place[i] = q + 1
        code = found_code[p]
        js[q] = found_j[p] if code == NO_SHIFT else number[found_j[p] * 27 + code]
    return counts, js, image_keys


def verlet_list(x, box, rlist):
    """The :class:`~.neighbor_cpu.PairList` of the pairs at most ``rlist`` apart at wrapped positions ``x``:
    the pairs of :func:`~.neighbor_cpu.build_pairs`, and images numbered as there, from a cell list
    (each row's pairs in the order found, not in order of ``j``)."""
    x = np.ascontiguousarray(x, np.float64)
    box = np.asarray(box, np.float64)
    if not (np.all(x >= 0.0) and np.all(x < box)):  # the bins index memory unchecked
        raise ValueError("positions must lie in [0, box) (wrapped) to be binned")
    bins = np.maximum(box * BINS_PER_CUTOFF // rlist, 1).astype(np.int64)
    # Wider bins where the box holds far more bins than atoms (a dilute gas): as right, and the
    # tables of bins stay the size of the atoms'.
    while np.prod(bins) > 4 * len(x) + 64:
        k = int(np.argmax(bins))
        bins[k] = max(bins[k] // 2, 1)
    # Room for the half list at the atoms' mean density and then some (it grows when that is short).
    expected = 0.5 * len(x) ** 2 / float(np.prod(box)) * 4.0 / 3.0 * np.pi * rlist ** 3
    counts, j, image_keys = _cell_list_pairs(x, box, float(rlist), bins, int(1.2 * expected) + 64)
    i = np.repeat(np.arange(len(x)), counts)
    return PairList(i, j, len(x), images=(image_keys // 27, image_shifts(image_keys % 27) * box), counts=counts)


@numba.njit(cache=True)
def _kick_drift(x, v, f, img, hold, box, kick, dt):
    x_new, v_new, img_new = np.empty_like(x), np.empty_like(v), img.copy()
    y = np.empty_like(x)
    move_sq = np.empty(x.shape[0])
    worst = 0.0
    for a in range(x.shape[0]):
        step_sq = 0.0
        disp_sq = 0.0
        for k in range(3):
            va = v[a, k] + kick * f[a, k]
            v_new[a, k] = va
            dx = dt * va
            step_sq += dx * dx
            length = box[k]
            xa = x[a, k] + dx
            if xa >= length:
                xa -= length
                img_new[a, k] += 1
            elif xa < 0.0:
                xa += length
                img_new[a, k] -= 1
            if xa >= length:  # x + L can round up to exactly L: that point is 0 again
                xa = 0.0
            x_new[a, k] = xa
            d = xa - hold[a, k]
            d -= length * np.rint(d / length)
            y[a, k] = hold[a, k] + d
            disp_sq += d * d
        move_sq[a] = step_sq
        worst = max(worst, disp_sq)
    return x_new, v_new, img_new, y, move_sq, worst


def kick_drift(x, v, f, img, hold, box, mass, dt):
    """The first half of a step: ``md_ref.half_kick``, ``md_ref.drift_wrap`` and ``build_frame`` in one pass.

    Returns
    -------
    (x, v, img, y, move_sq, disp_sq_max)
        New positions (wrapped), velocities and image counts; positions in the frame of the last list
        build; each particle's squared move; the largest squared displacement since the build.
    """
    return _kick_drift(x, v, f, img, hold, np.asarray(box, np.float64), 0.5 * dt / mass, dt)


@numba.njit(cache=True)
def _kick(v, f, kick):
    out = np.empty_like(v)
    for a in range(v.shape[0]):
        for k in range(3):
            out[a, k] = v[a, k] + kick * f[a, k]
    return out


def half_kick(v, f, mass, dt):
    """``md_ref.half_kick`` in one pass."""
    return _kick(v, f, 0.5 * dt / mass)
