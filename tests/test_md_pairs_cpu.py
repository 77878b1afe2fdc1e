"""Neighbour lists and pair forces of the CPU backends (NumPy and compiled), against the k-d tree and
direct sums over all pairs."""
import sys

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from solvers.errors import InputError
from solvers.kernels import md_ref
from solvers.md import Langevin, LennardJones, Morse, Simulation, VelocityVerlet, cpu, lattice_state, neighbor_cpu
from solvers.md.neighbor_cpu import CandidatePairs, build_pairs

RLIST = 2.8


def liquid(seed, cells=(5, 6, 7), noise=0.12):
    """An fcc lattice (density 0.8442) shaken by Gaussian noise, wrapped into its box (edges 8.4 to 11.8)."""
    state = lattice_state(cells=cells, temp=1.0, seed=seed)
    x = state.positions + np.random.default_rng(seed).normal(0.0, noise, state.positions.shape)
    return x % state.box, state.box


def direct_terms(x, box, potential):
    """Forces, and halves of pair energy and virial per atom, summed over all pairs (minimum image)."""
    d = x[None, :, :] - x[:, None, :]  # d[i, j] = x_j - x_i
    d -= box * np.rint(d / box)
    rsq = np.einsum("ijk,ijk->ij", d, d)
    np.fill_diagonal(rsq, 1.0)
    fr, e, w = potential.terms(rsq)
    np.fill_diagonal(fr, 0.0), np.fill_diagonal(e, 0.0), np.fill_diagonal(w, 0.0)
    return -np.einsum("ij,ijk->ik", fr, d), 0.5 * e.sum(axis=1), 0.5 * w.sum(axis=1)


def numba_kernels():
    pytest.importorskip("numba")
    from solvers.md import numba_kernels
    return numba_kernels


def list_and_forces(mode, x, box):
    """A list built and a pair-force function, as CPU ``mode`` does them."""
    if mode == "numba":
        return numba_kernels().verlet_list(x, box, RLIST), cpu.pair_forces(mode)
    return CandidatePairs(x, box, RLIST).verlet(x, RLIST), cpu.pair_forces(mode)


@pytest.mark.parametrize("potential", [LennardJones(rc=2.5, shift=True), Morse(1.0, 6.0, 1.12, rc=2.5)],
                         ids=["lj", "morse"])
@pytest.mark.parametrize("mode,block", [("numpy", neighbor_cpu.BLOCK_PAIRS), ("numpy", 100), ("numba", None)])
def test_pair_forces_match_direct_sums(monkeypatch, potential, mode, block):
    if block:
        monkeypatch.setattr(neighbor_cpu, "BLOCK_PAIRS", block)  # 100: hundreds of blocks, some rows split off
    x, box = liquid(1)
    pairs, forces = list_and_forces(mode, x, box)
    assert len(pairs.image_source) > 0  # pairs across the periodic boundary take part
    f, pe, vir = forces(pairs, x, potential, len(x), True)
    f_ref, pe_ref, vir_ref = direct_terms(x, box, potential)
    scale = np.abs(f_ref).max()
    np.testing.assert_allclose(f, f_ref, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(pe, pe_ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(vir, vir_ref, rtol=1e-12, atol=1e-12)
    f_only, none_pe, none_vir = forces(pairs, x, potential, len(x), False)
    np.testing.assert_array_equal(f_only, f)
    assert none_pe is None and none_vir is None


def in_order(pairs):
    """A list's pairs as (i, source of j, image shift of j), sorted by i, then j's source."""
    src = pairs.source(pairs.j)
    shift = np.zeros((len(pairs), 3))
    image = pairs.j >= pairs.n_atoms
    shift[image] = pairs.image_shift[pairs.j[image] - pairs.n_atoms]
    order = np.lexsort((src, pairs.i))
    return pairs.i[order], src[order], shift[order]


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(cells=st.tuples(*[st.integers(1, 6)] * 3), seed=st.integers(0, 2 ** 16),
       noise=st.sampled_from([0.0, 0.05, 0.3]), reach=st.floats(0.2, 0.6))
def test_cell_list_is_the_tree_list(cells, seed, noise, reach):
    """Boxes from one to a few cutoffs wide (fewer bins than the stencil reaches: images worked out pair by pair),
    a perfect lattice (distances tied) or shaken, cutoffs up to beyond half the box (one image a pair all the same).
    A pair as far apart as the cutoff itself, to rounding, may fall on either side of it in either method (a
    perfect lattice at reach 0.5 puts 16 pairs there): such draws are left out."""
    kernels = numba_kernels()
    state = lattice_state(cells=cells, temp=1.0, seed=seed)
    x = (state.positions + np.random.default_rng(seed).normal(0.0, noise, state.positions.shape)) % state.box
    rlist = reach * float(min(state.box))
    inside, within_rounding = (len(build_pairs(x, state.box, rlist * f)[0]) for f in (1 - 1e-9, 1 + 1e-9))
    assume(inside == within_rounding)
    got = kernels.verlet_list(x, state.box, rlist)
    i, j = build_pairs(x, state.box, rlist)
    got_i, got_src, got_shift = in_order(got)
    np.testing.assert_array_equal(got_i, i)
    np.testing.assert_array_equal(got_src, j)
    ref_i, ref_src, ref_shift = in_order(CandidatePairs(x, state.box, rlist).verlet(x, rlist))
    np.testing.assert_array_equal(got_shift, ref_shift)  # the same nearest image of each pair
    np.testing.assert_array_equal(np.diff(got.offsets), np.bincount(i, minlength=len(x)))


def test_cell_list_of_a_dilute_gas():
    """Far more bins of half the cutoff than atoms (a billion for 300 atoms): wider bins, the same pairs."""
    rng = np.random.default_rng(8)
    box = np.array([3000.0, 2000.0, 1000.0])
    x = rng.uniform(0.0, 1.0, (300, 3)) * box
    x[1:60] = (x[0] + rng.normal(0.0, 1.5, (59, 3))) % box  # a cluster, across the faces maybe
    x[60:70] = rng.uniform(-1.0, 1.0, (10, 3)) % box  # around a corner: pairs across three faces
    got = numba_kernels().verlet_list(x, box, RLIST)
    i, j = build_pairs(x, box, RLIST)
    got_i, got_src, got_shift = in_order(got)
    assert len(i) > 100 and np.any(got_shift.all(axis=1))
    np.testing.assert_array_equal(got_i, i)
    np.testing.assert_array_equal(got_src, j)


@pytest.mark.parametrize("bad", [-1e-12, 1.0, np.nan])
def test_cell_list_refuses_positions_it_cannot_bin(bad):
    x, box = liquid(4)
    x[7, 1] = bad * box[1] if np.isfinite(bad) else bad
    with pytest.raises(ValueError, match="must lie in"):
        numba_kernels().verlet_list(x, box, RLIST)


def test_compiled_integration_is_the_numpy_one():
    kernels = numba_kernels()
    rng = np.random.default_rng(5)
    x, box = liquid(3)
    hold = (x + rng.normal(0.0, 0.1, x.shape)) % box
    v, f = rng.normal(0.0, 40.0, x.shape), rng.normal(0.0, 500.0, x.shape)  # many particles cross a face
    img = rng.integers(-3, 4, x.shape)
    # At the faces: across the upper one by a hair, the lower one by a hair, and below 0 by less than
    # half an ulp of the box (x + L rounds to L: the point is 0 again).
    x[0], x[1:3] = np.nextafter(box, 0), 0.0
    v[:3] = np.array([2e-12, -2e-12, -2e-15])[:, None] / 0.005 * 0.005
    f[:3] = 0.0
    got = kernels.kick_drift(x, v, f, img, hold, box, 1.3, 0.005)
    ref = cpu.kick_drift(x, v, f, img, hold, box, 1.3, 0.005)
    assert np.any(got[2] != img)
    for name, a, b in zip(("x", "v", "img", "y"), got, ref):
        np.testing.assert_array_equal(a, b, err_msg=name)
    # Sums of three squares, added in another order than einsum's: within an ulp.
    np.testing.assert_allclose(got[4], ref[4], rtol=4.5e-16, atol=0)
    np.testing.assert_allclose(got[5], ref[5], rtol=4.5e-16, atol=0)
    assert np.all((got[0] >= 0) & (got[0] < box))
    assert got[0][2].tolist() == [0.0] * 3 and np.all(got[2][:3] == img[:3] + [[1], [-1], [-1]])
    np.testing.assert_array_equal(kernels.half_kick(v, f, 1.3, 0.005), md_ref.half_kick(v, f, 1.3, 0.005))


def test_numba_and_numpy_runs_agree():
    numba_kernels()
    runs = {}
    for mode in ("numpy", "numba"):
        sim = Simulation(lattice_state(cells=(7, 6, 8), temp=1.44, seed=3), LennardJones(),
                         Langevin(0.005, 1.2, 0.5, seed=9), device="cpu", mode=mode)
        sim.run(200, thermo_every=100)
        runs[mode] = sim
    a, b = runs["numpy"], runs["numba"]
    assert a.neighbor_builds == b.neighbor_builds > 10
    np.testing.assert_allclose(b.positions, a.positions, rtol=0, atol=1e-9)  # the order of the sums only
    for ra, rb in zip(a.thermo_log, b.thermo_log):
        np.testing.assert_allclose([rb[k] for k in ("Temp", "E_pair", "Press")],
                                   [ra[k] for k in ("Temp", "E_pair", "Press")], rtol=1e-10)


def test_numba_mode_without_numba_is_refused(monkeypatch):
    import solvers.md
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    monkeypatch.delitem(sys.modules, "solvers.md.numba_kernels", raising=False)
    monkeypatch.delattr(solvers.md, "numba_kernels", raising=False)
    state, ff = lattice_state(cells=(4, 4, 4)), LennardJones()
    with pytest.raises(InputError, match="--mode: needs Numba"):
        Simulation(state, ff, VelocityVerlet(0.005), device="cpu", mode="numba")
    assert Simulation(state, ff, VelocityVerlet(0.005), device="cpu").mode == "numpy"  # auto: what there is


def test_cpu_mode_on_the_gpu_is_refused(monkeypatch):
    from solvers.md import simulation
    monkeypatch.setattr(simulation, "resolve_device", lambda device: ("gpu", ""))
    with pytest.raises(InputError, match="--mode: mode numba is a CPU mode"):
        Simulation(lattice_state(cells=(4, 4, 4)), LennardJones(), VelocityVerlet(0.005), device="gpu",
                   mode="numba")


def test_list_cut_from_candidates_is_the_tree_list():
    x0, box = liquid(2)
    radius = 3.6
    candidates = CandidatePairs(x0, box, radius)
    rng = np.random.default_rng(7)
    step = rng.normal(size=x0.shape)
    step *= 0.99 * 0.5 * (radius - RLIST) / np.linalg.norm(step, axis=1, keepdims=True)
    x1 = (x0 + step) % box  # every atom moved almost the most the candidates allow, many across a face
    assert np.any(np.abs(x1 - x0) > 0.5 * box)
    assert candidates.covers(x1, RLIST)
    cut = candidates.verlet(x1, RLIST)
    tree = CandidatePairs(x1, box, RLIST).verlet(x1, RLIST)
    for name in ("i", "j", "image_source", "image_shift"):
        np.testing.assert_array_equal(getattr(cut, name), getattr(tree, name), err_msg=name)
    i, j = build_pairs(x1, box, RLIST)
    np.testing.assert_array_equal(cut.i, i)
    np.testing.assert_array_equal(cut.source(cut.j), j)
    x2 = x1.copy()
    x2[5] = (x0[5] + 1.02 * step[5] / 0.99) % box
    assert not candidates.covers(x2, RLIST)


def test_runs_with_and_without_candidates_agree_bit_for_bit(monkeypatch):
    def run():
        sim = Simulation(lattice_state(cells=(6, 6, 6), temp=1.44, seed=3), LennardJones(),
                         Langevin(0.005, 1.2, 0.5, seed=9), device="cpu", mode="numpy")
        sim.run(200, thermo_every=100)
        return sim

    wide = run()
    monkeypatch.setattr(cpu, "CANDIDATE_SKINS", 0.0)  # a tree query at every list build
    exact = run()
    assert wide.neighbor_builds == exact.neighbor_builds > 10
    np.testing.assert_array_equal(wide.positions, exact.positions)
    np.testing.assert_array_equal(wide.velocities, exact.velocities)


def test_pairs_sorted_whether_or_not_they_pack_into_one_integer():
    pairs = np.random.default_rng(4).integers(0, 1000, size=(5000, 2))
    packed = neighbor_cpu._sorted(pairs, 1000)
    unpacked = neighbor_cpu._sorted(pairs, 2 ** 40)  # indices too wide for one int64 key: lexsort
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    for got in (packed, unpacked):
        np.testing.assert_array_equal(got[0], pairs[order, 0])
        np.testing.assert_array_equal(got[1], pairs[order, 1])
