"""Spatial decomposition: ghost selection and the migration records, against their definitions (NumPy)."""
import numpy as np
import pytest

from solvers.kernels import md_ref
from solvers.md.domain import Domain, choose_grid


def near_faces(dom, x, offset, rlist):
    """Within ``rlist`` of every face ``offset`` points through: the definition, one offset at a time."""
    mask = np.ones(len(x), dtype=bool)
    for d, o in enumerate(offset):
        if o < 0:
            mask &= x[:, d] - dom.lo[d] < rlist
        elif o > 0:
            mask &= dom.hi[d] - x[:, d] < rlist
    return mask


@pytest.mark.parametrize("box, ranks", [((20, 20, 20), 2), ((10, 9, 11), 2), ((12, 12, 30), 3), ((6, 6, 6), 1),
                                        ((30, 30, 30), 8), ((9, 20, 20), 3)])
def test_ghost_pairs_are_the_atoms_near_each_route_s_faces(box, ranks):
    rng = np.random.default_rng(ranks)
    rlist = 2.8
    grid = choose_grid(np.array(box, float), ranks, rlist)
    for rank in range(ranks):
        dom = Domain(np.array(box, float), grid, rank)
        x = dom.lo + rng.random((2000, 3)) * (dom.hi - dom.lo)
        index, route = dom.ghost_pairs(x, rlist)
        routes = dom.routes()
        want = [np.flatnonzero(near_faces(dom, x, offset, rlist)) for offset, _, _ in routes]
        np.testing.assert_array_equal(index, np.concatenate(want))
        np.testing.assert_array_equal(route, np.repeat(np.arange(len(routes)), [len(w) for w in want]))
        peers = [peer for _, peer, _ in routes]
        assert peers == sorted(peers)


def test_migration_records_round_trip():
    rng = np.random.default_rng(5)
    box, grid = np.array([10.0, 12.0, 9.0]), (2, 1, 3)
    dom = Domain(box, grid, 4)
    origin = dom.lo - 3.0
    x = rng.uniform(-5, 15, (500, 3))  # frame positions, some outside the box once shifted
    v, img = rng.normal(size=(500, 3)), rng.integers(-3, 3, (500, 3))
    rec = md_ref.migration_records(x, v, img, np.arange(500), np.arange(500) + 7, origin, box, dom.width, grid)
    wrapped = rec[:, 0:3]
    assert ((wrapped >= 0) & (wrapped < box)).all()
    np.testing.assert_allclose(wrapped + rec[:, 6:9] * box, x + origin + img * box, atol=1e-12)
    np.testing.assert_array_equal(rec[:, md_ref.RECORD_OWNER], Domain(box, grid, 0).owners(wrapped))
    back = md_ref.unpack_records(rec, origin)
    np.testing.assert_allclose(back[0], wrapped - origin)
    np.testing.assert_array_equal(back[1], v)
    np.testing.assert_array_equal(back[3], np.arange(500))
    np.testing.assert_array_equal(back[4], np.arange(500) + 7)


def test_migration_keys_name_the_route_to_the_new_owner():
    rng = np.random.default_rng(8)
    box, grid = np.array([12.0, 9.0, 15.0]), (3, 2, 1)
    for rank in range(6):
        dom = Domain(box, grid, rank)
        routes = dom.routes()
        x = rng.uniform(dom.lo - 2.0, dom.hi + 2.0, (400, 3))
        rec = md_ref.migration_records(x, x, np.zeros((400, 3)), np.arange(400), np.arange(400), np.zeros(3), box,
                                       dom.width, grid)
        keys = md_ref.migration_keys(rec, dom.coords, grid, [o for o, _, _ in routes])
        key = np.log2(keys).astype(int)
        owner = rec[:, md_ref.RECORD_OWNER].astype(int)
        assert ((key == 0) == (owner == rank)).all()
        moved = key > 0
        assert (key[moved] < md_ref.LOST).all()
        np.testing.assert_array_equal([routes[k - 1][1] for k in key[moved]], owner[moved])


def test_partition_bits_groups_by_key_then_index():
    rng = np.random.default_rng(2)
    mask = rng.integers(0, 2 ** 5, 300).astype(np.uint32) * (rng.random(300) < 0.4)
    index, key = md_ref.partition_bits(mask, 5)
    want = [(i, k) for k in range(5) for i in range(300) if mask[i] >> k & 1]
    assert list(zip(index, key)) == want
