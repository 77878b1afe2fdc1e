"""Matrix formats: each layout reproduces the product, and auto picks the format the rows call for."""
import numpy as np
import pytest
import scipy.sparse as sp

from solvers.errors import InputError
from solvers.formats import CSR, ELL, SELL, choose_format
from solvers.formats.csr import row_lanes
from solvers.gallery import poisson, power_law_laplacian, random_geometric_laplacian, stencil27


def one_long_row(n=300, length=2000):
    """A diagonal matrix plus one row (and column) coupled to ``length`` others: pieces of a long row."""
    A = sp.diags(np.full(n + length, 4.0)).tolil()
    A[n // 2, n:] = 1e-3
    A[n:, n // 2] = 1e-3
    return sp.csr_matrix(A)


def with_empty_rows(n=200):
    A = sp.random(n, n, density=0.03, random_state=np.random.default_rng(4), format="csr")
    A = sp.csr_matrix(A + A.T)
    A.data[:] = 1.0
    keep = np.ones(n, bool)
    keep[::7] = False  # rows (and columns) with no entries at all
    return sp.csr_matrix(sp.diags(keep.astype(float)) @ A @ sp.diags(keep.astype(float)))


MATRICES = {
    "poisson2d": lambda: poisson((23, 17)),
    "poisson3d": lambda: poisson((7, 9, 5)),
    "stencil27": lambda: stencil27((9, 8, 7)),
    "geometric": lambda: random_geometric_laplacian(3000, seed=2),
    "power_law": lambda: power_law_laplacian(4000, seed=3),
    "one_long_row": one_long_row,
    "empty_rows": with_empty_rows,
}


def arrays(A):
    return A.indptr.astype(np.int32), A.indices.astype(np.int32)


@pytest.mark.parametrize("name", MATRICES)
@pytest.mark.parametrize("fmt", ["ell", "sell", "csr"])
def test_layout_reproduces_the_product(name, fmt):
    A = MATRICES[name]()
    try:
        layout = choose_format(*arrays(A), np, fmt)
    except InputError as exc:
        assert fmt == "ell" and "ELL needs rows" in str(exc)
        assert np.diff(A.indptr).max() > ELL.MAX_WIDTH or np.diff(A.indptr).min() == 0
        return
    x = np.random.default_rng(0).standard_normal(A.shape[1])
    val = layout.values(A.data)
    np.testing.assert_allclose(layout.product(val, x), A @ x, rtol=1e-13, atol=1e-12)
    # new values in place, same layout (update_values)
    val2 = layout.values(2.0 * A.data, out=val)
    np.testing.assert_allclose(layout.product(val2, x), 2.0 * (A @ x), rtol=1e-13, atol=1e-12)
    assert layout.struct.dtype.names == tuple(f for f, _ in layout.fields)


@pytest.mark.parametrize("name, expected", [("poisson2d", "ell"), ("poisson3d", "ell"), ("stencil27", "ell"),
                                            ("geometric", "sell"), ("power_law", "sell"),
                                            ("one_long_row", "sell")])
def test_auto_follows_row_lengths(name, expected):
    assert choose_format(*arrays(MATRICES[name]()), np).name == expected


def test_ell_padding_points_at_its_own_row():
    A = poisson((7, 9, 5))
    layout = ELL(*arrays(A), np)
    n, val = A.shape[0], layout.values(A.data)
    pad = val == 0
    assert layout.width == 7 and pad.any()
    assert np.array_equal(layout.col[pad], np.tile(np.arange(n), 7)[pad])


@pytest.mark.parametrize("lanes", [1, 2, 4, 8])
@pytest.mark.parametrize("name", ["geometric", "power_law", "one_long_row", "empty_rows"])
def test_sell_with_several_lanes_a_row_reproduces_the_product(name, lanes):
    A = MATRICES[name]()
    layout = SELL(*arrays(A), np, lanes=lanes)
    x = np.random.default_rng(1).standard_normal(A.shape[1])
    np.testing.assert_allclose(layout.product(layout.values(A.data), x), A @ x, rtol=1e-13, atol=1e-12)
    rows = layout.slice_rows.reshape(-1, lanes)
    assert np.all(rows == rows[:, :1])  # the lanes of a row agree on it
    assert dict(layout.defines)["SELL_LANES"] == str(lanes)


def test_sell_lanes_follow_mean_row_length():
    assert SELL.auto_lanes(15 * 100, 100) == 4 and SELL.auto_lanes(7.7 * 100, 100) == 2
    assert SELL.auto_lanes(3 * 100, 100) == 1 and SELL.auto_lanes(60 * 100, 100) == 8
    A = power_law_laplacian(4000, seed=3)
    assert SELL(*arrays(A), np).lanes == SELL.auto_lanes(A.nnz, A.shape[0])


@pytest.mark.parametrize("row_order", ["length", "neighbours"])
def test_sell_slices_sorted_within_windows_and_padding_small(row_order):
    A = random_geometric_laplacian(20000, seed=1)
    layout = SELL(*arrays(A), np, lanes=1, row_order=row_order)
    lengths = np.diff(A.indptr)
    rows = layout.slice_rows
    slot_len = np.where(rows >= 0, lengths[np.maximum(rows, 0)], 0)
    for w in range(0, rows.size, layout.sigma):  # non-increasing within each window
        chunk = slot_len[w:w + layout.sigma]
        assert np.all(np.diff(chunk[rows[w:w + layout.sigma] >= 0]) <= 0)
    assert sorted(rows[rows >= 0].tolist()) == list(range(A.shape[0]))  # every row once
    if row_order == "neighbours":  # the smallest windows, whatever the padding
        assert layout.sigma == SELL.SIGMAS[0] and layout.padding <= 2 * SELL.MAX_PADDING
        return
    assert layout.padding <= SELL.MAX_PADDING
    slots = dict(zip(SELL.SIGMAS, SELL._slots_per_window(lengths.astype(np.int64), np)))
    assert layout.sigma == min(s for s in SELL.SIGMAS if slots[s] <= 1.05 * A.nnz)
    # with 4 lanes a row the rounding alone pads ~10%: the window only has to come close to the widest's
    four = SELL(*arrays(A), np, lanes=4, row_order="length")
    slots = dict(zip(SELL.SIGMAS, SELL._slots_per_window(lengths.astype(np.int64), np, 4)))
    assert four.sigma < SELL.SIGMAS[-1]
    assert slots[four.sigma] <= slots[SELL.SIGMAS[-1]] + 0.025 * A.nnz


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_sell_slots_per_window_equal_slices_laid_out_one_by_one(lanes):
    lengths = np.random.default_rng(2).integers(0, SELL.LONG_ROW + 1, size=5000)
    rows_per_slice = 32 // lanes
    for sigma, slots in zip(SELL.SIGMAS, SELL._slots_per_window(lengths, np, lanes)):
        expected = 0
        for w in range(0, lengths.size, sigma):
            window = np.sort(lengths[w:w + sigma])[::-1]
            for s in range(0, window.size, rows_per_slice):  # a slice is as wide as its longest row
                expected += 32 * -(-int(window[s]) // lanes)
        assert slots == expected, sigma


def sectors_a_window(A, layout):
    """Distinct 32-byte sectors of float64 columns that each window of SELL rows gathers, per nonzero."""
    rows = layout.slice_rows[::layout.lanes]
    rows = rows[rows >= 0]
    window = np.repeat(np.arange(rows.size) // layout.sigma, np.diff(A.indptr)[rows])
    cols = np.concatenate([A.indices[A.indptr[r]:A.indptr[r + 1]] for r in rows])
    return np.unique(window * (A.shape[0] // 4 + 1) + cols // 4).size / cols.size


def test_sell_rows_by_neighbours_share_gathered_sectors():
    A = random_geometric_laplacian(20000, seed=1)  # random numbering: no window shares columns by itself
    by_length = SELL(*arrays(A), np, lanes=4, row_order="length")
    by_neighbours = SELL(*arrays(A), np, lanes=4, row_order="neighbours")
    by_length.sigma = by_neighbours.sigma  # the same windows' worth of rows for the count
    assert sectors_a_window(A, by_neighbours) < 0.5 * sectors_a_window(A, by_length)
    assert sorted(by_neighbours.slice_rows[by_neighbours.slice_rows >= 0][::4].tolist()) == list(range(20000))


def test_sell_auto_orders_rows_by_neighbours_only_where_windows_read_far_fewer_sectors():
    from scipy.sparse.csgraph import reverse_cuthill_mckee
    geometric = random_geometric_laplacian(20000, seed=1)
    chosen = SELL(*arrays(geometric), np, row_order="auto")
    assert chosen.row_order == "neighbours" and chosen.sectors[1] <= SELL.NEIGHBOUR_GAIN * chosen.sectors[0]
    assert f"rows by neighbours ({chosen.sectors[0]:.2f} sectors a nonzero given" in chosen.describe()
    order = reverse_cuthill_mckee(geometric, symmetric_mode=True)
    banded = sp.csr_matrix(geometric[order][:, order])  # numbered well already: nothing to gain
    banded.sort_indices()
    assert SELL(*arrays(banded), np, row_order="auto").row_order == "length"
    no_locality = power_law_laplacian(20000, seed=1)
    assert SELL(*arrays(no_locality), np, row_order="auto").row_order == "length"


def test_sell_groups_of_32_slices_hold_long_and_short_slices_alike():
    A = power_law_laplacian(100000, seed=1)
    layout = SELL(*arrays(A), np, lanes=2, row_order="length")
    per_window = layout.sigma // 16
    assert per_window > 32  # windows of several groups, whose slices are dealt out
    widths = np.diff(layout.slice_ptr)[:layout.slices // per_window * per_window].reshape(-1, per_window)
    group_work = widths.reshape(widths.shape[0], -1, 32).sum(axis=2)
    assert group_work.max() <= 1.5 * group_work.min()
    assert np.all(np.diff(widths.reshape(widths.shape[0], -1, 32), axis=2) <= 0)  # longest first in a group
    np.testing.assert_allclose(layout.product(layout.values(A.data), np.arange(A.shape[0]) % 7.0),
                               A @ (np.arange(A.shape[0]) % 7.0))


@pytest.mark.parametrize("name", ["empty_rows", "one_long_row"])
def test_sell_neighbour_key_is_the_least_rank_of_a_short_rows_columns(name):
    A = MATRICES[name]()
    layout = SELL(*arrays(A), np)
    rank = np.random.default_rng(1).permutation(A.shape[0]).astype(np.int32)
    key = layout._neighbour_key(*arrays(A), rank)
    for r in range(A.shape[0]):
        cols = A.indices[A.indptr[r]:A.indptr[r + 1]]
        assert key[r] == (rank[cols].min() if 0 < cols.size <= SELL.LONG_ROW else A.shape[0])


@pytest.mark.parametrize("name", MATRICES)
def test_sell_rows_by_neighbours_reproduce_the_product(name):
    A = MATRICES[name]()
    layout = SELL(*arrays(A), np, row_order="neighbours")
    x = np.random.default_rng(0).standard_normal(A.shape[1])
    np.testing.assert_allclose(layout.product(layout.values(A.data), x), A @ x, rtol=1e-13, atol=1e-12)


def test_sell_rows_of_a_rectangular_matrix_keep_their_length_order():
    A = sp.csr_matrix(sp.random(300, 1000, density=0.02, random_state=np.random.default_rng(1)))
    assert SELL(*arrays(A), np, row_order="auto").row_order == "length"
    with pytest.raises(InputError, match="need a square matrix"):
        SELL(*arrays(A), np, row_order="neighbours")


def test_sell_unknown_row_order_is_refused():
    with pytest.raises(InputError, match="SELL row order must be one of auto, neighbours, length"):
        SELL(*arrays(poisson((4, 4))), np, row_order="random")


def test_sell_cuts_long_rows_into_pieces():
    A = one_long_row(n=300, length=2000)
    layout = SELL(*arrays(A), np)
    assert layout.long_rows.tolist() == [150] and layout.pieces == -(-2001 // SELL.PIECE_LENGTH)
    assert layout.row_pieces.tolist() == [0, layout.pieces]
    sizes = np.diff(layout.piece_ptr)
    assert sizes.sum() == 2001 and sizes.max() <= SELL.PIECE_LENGTH
    assert "1 rows over 64 entries in 4 pieces" in layout.describe()


def test_csr_lanes_follow_mean_row_length():
    assert row_lanes(7 * 100, 100) == 8 and row_lanes(3 * 100, 100) == 4 and row_lanes(100, 100) == 2
    assert row_lanes(1000 * 10, 10) == 32
    A = power_law_laplacian(1000, seed=0)
    layout = CSR(*arrays(A), np)
    assert layout.lanes == row_lanes(A.nnz, 1000)
    np.testing.assert_array_equal(layout.values(A.data), A.data)


def test_unknown_format_is_refused():
    with pytest.raises(InputError, match="matrix format must be auto or one of ell, sell, csr"):
        choose_format(*arrays(poisson((4, 4))), np, "bsr")


@pytest.mark.gpu
@pytest.mark.parametrize("row_order", ["auto", "length"])
@pytest.mark.parametrize("lanes", [1, 2, 4, 8])
@pytest.mark.parametrize("name", ["geometric", "power_law", "one_long_row", "empty_rows"])
def test_sell_layout_kernel_equals_the_numpy_layout(cupy, name, lanes, row_order):
    A = MATRICES[name]()
    ref = SELL(*arrays(A), np, lanes=lanes, row_order=row_order)
    dev = SELL(*(cupy.asarray(a) for a in arrays(A)), cupy, lanes=lanes, row_order=row_order)
    assert (dev.sigma, dev.size, dev.slices, dev.pieces) == (ref.sigma, ref.size, ref.slices, ref.pieces)
    for field in ("_pos", "col", "slice_ptr", "slice_rows", "piece_ptr", "piece_row", "long_rows", "row_pieces"):
        np.testing.assert_array_equal(getattr(dev, field).get(), getattr(ref, field), err_msg=field)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["geometric", "power_law", "one_long_row", "empty_rows"])
def test_sell_neighbour_key_kernel_equals_numpy(cupy, name):
    A = MATRICES[name]()
    rank = np.random.default_rng(2).permutation(A.shape[0]).astype(np.int32)
    ref = SELL(*arrays(A), np)._neighbour_key(*arrays(A), rank)
    dev = SELL(*(cupy.asarray(a) for a in arrays(A)), cupy)
    np.testing.assert_array_equal(dev._neighbour_key(*(cupy.asarray(a) for a in arrays(A)), cupy.asarray(rank)).get(),
                                  ref)
