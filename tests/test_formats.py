"""Matrix formats: each layout reproduces the product, and auto picks the format the rows call for."""
import itertools
from unittest import mock

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from solvers.errors import InputError
from solvers.formats import CSR, DIA, ELL, SELL, DiagonalsDoNotFit, choose_format
from solvers.formats.base import Pattern, copy_into, entry_rows, increasing_rows, pattern_stats, window_sectors
from solvers.formats.csr import row_lanes
from solvers.formats.sell import LayoutBuild, neighbour_key, neighbours_order
from solvers.gallery import (periodic_poisson, poisson, power_law_laplacian, random_geometric_laplacian,
                             stencil27)

from fuzzing import fuzz, spd_matrices


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


def shuffled(A, seed=0):
    """``A`` numbered at random (symmetrically)."""
    order = np.random.default_rng(seed).permutation(A.shape[0])
    return sp.csr_matrix(A.tocsr()[order][:, order])


@pytest.mark.parametrize("name", MATRICES)
@pytest.mark.parametrize("fmt", ["dia", "ell", "sell", "csr"])
def test_layout_reproduces_the_product(name, fmt):
    A = MATRICES[name]()
    try:
        layout = choose_format(*arrays(A), np, fmt)
    except DiagonalsDoNotFit as exc:
        assert fmt == "dia" and name in ("geometric", "empty_rows") and "lie off them" in str(exc)
        return
    except InputError as exc:
        assert fmt in ("ell", "dia") and f"{fmt.upper()} needs rows" in str(exc)
        assert np.diff(A.indptr).max() > ELL.MAX_WIDTH or np.diff(A.indptr).min() == 0
        return
    x = np.random.default_rng(0).standard_normal(A.shape[1])
    val = layout.values(A.data)
    np.testing.assert_allclose(layout.product(val, x), A @ x, rtol=1e-13, atol=1e-12)
    # new values in place, same layout (update_values)
    val2 = layout.values(2.0 * A.data, out=val)
    np.testing.assert_allclose(layout.product(val2, x), 2.0 * (A @ x), rtol=1e-13, atol=1e-12)
    assert layout.struct.dtype.names == tuple(f for f, _ in layout.fields)
    # the padding holds 0, and the values go back to CSR order unchanged
    assert np.count_nonzero(val2) == np.count_nonzero(A.data)
    np.testing.assert_array_equal(layout.csr_values(val2), 2.0 * A.data)


@pytest.mark.parametrize("name, expected", [("poisson2d", "dia"), ("poisson3d", "dia"), ("stencil27", "dia"),
                                            ("stencil27 shuffled", "ell"), ("poisson2d shuffled", "ell"),
                                            ("geometric", "sell"), ("power_law", "sell"),
                                            ("one_long_row", "sell")])
def test_auto_follows_row_lengths_and_diagonals(name, expected):
    A = MATRICES[name.split()[0]]()
    assert choose_format(*arrays(shuffled(A) if "shuffled" in name else A), np).name == expected


def test_ell_padding_points_at_its_own_row():
    A = poisson((7, 9, 5))
    layout = ELL(*arrays(A), np)
    n, val = A.shape[0], layout.values(A.data)
    pad = val == 0
    assert layout.width == 7 and pad.any()
    assert np.array_equal(layout.col[pad], np.tile(np.arange(n), 7)[pad])


def banded_rectangular():
    """Three diagonals of a 20 x 30 matrix: the columns run past the rows."""
    return sp.csr_matrix(sp.diags([1.0, 2.0, 3.0], [0, 4, 9], shape=(20, 30)))


def torus(m):
    """The 5-point Laplacian on an m x m torus: the walls' couplings wrap around."""
    return periodic_poisson((m, m), shift=0.1)


def test_periodic_poisson_is_the_torus_laplacian():
    def ring(m):
        T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m)).tolil()
        T[0, m - 1] = T[m - 1, 0] = -1.0
        return sp.csr_matrix(T)
    A = periodic_poisson((5, 6), shift=0.25)
    expected = sp.kron(ring(5), sp.eye(6)) + sp.kron(sp.eye(5), ring(6)) + 0.25 * sp.eye(30)
    assert abs(A - expected).max() == 0 and A.has_sorted_indices
    B = periodic_poisson((4, 3, 5))  # every point has six neighbours; the least eigenvalue is the shift
    assert set(np.diff(B.indptr)) == {7} and abs(B - B.T).max() == 0
    assert np.linalg.eigvalsh(B.toarray()).min() == pytest.approx(1e-2, rel=1e-9)
    with pytest.raises(ValueError, match="shift must be positive"):
        periodic_poisson((4, 4), shift=0.0)


@pytest.mark.parametrize("name", ["poisson2d", "poisson3d", "stencil27", "banded rectangular"])
def test_dia_slots_are_ells_on_the_stencils_diagonals(name):
    A = banded_rectangular() if name == "banded rectangular" else MATRICES[name]()
    dia, ell = DIA(*arrays(A), np), ELL(*arrays(A), np)
    n, widest = A.shape[0], int(np.argmax(np.diff(A.indptr)))
    np.testing.assert_array_equal(dia.diagonals, A.indices[A.indptr[widest]:A.indptr[widest + 1]] - widest)
    assert dia.describe().startswith(f"dia ({dia.width} diagonals") and dia.index_bytes() == 0
    assert dia.exceptions == 0 and dia.rest_ptr is None and ("DIA_EXCEPTIONS", "0") in dia.defines
    assert (dia.width, dia.size, dia.columns) == (ell.width, ell.size, max(n, int(A.indices.max()) + 1))
    # every stored slot holds the same entry as ELL's, at a column the kernel computes
    held = dia._src >= 0
    np.testing.assert_array_equal(dia.slot_columns()[held], A.indices[dia._src[held]])
    cols = dia.slot_columns()
    assert cols.min() >= 0 and cols.max() < dia.columns
    x = np.random.default_rng(2).standard_normal(dia.columns)
    np.testing.assert_array_equal(dia.product(dia.values(A.data), x), ell.product(ell.values(A.data), x))


@pytest.mark.parametrize("make, width, exceptions", [(lambda: poisson((16, 16, 16)), 7, 0),
                                                     (lambda: stencil27((16, 16, 16)), 27, 0),
                                                     (lambda: torus(64), 5, 4 * 64)])
def test_dia_elects_the_stencils_diagonals_on_power_of_two_grids(make, width, exceptions):
    """Rows sampled at even spacings would all lie on such a grid's walls, whose rows lack diagonals."""
    A = make()
    layout = choose_format(*arrays(A), np)
    assert layout.name == "dia" and layout.width == width
    assert layout.exceptions == exceptions  # a torus's wrapping couplings (two a line's ends), none on a grid
    assert len(set(DIA.sampled_rows(A.shape[0], DIA.SAMPLES).tolist())) == DIA.SAMPLES


def test_dia_keeps_a_torus_wrapping_couplings_as_exceptions():
    A = torus(40)
    layout = choose_format(*arrays(A), np)
    assert layout.name == "dia" and list(layout.diagonals) == [-40, -1, 0, 1, 40]
    assert layout.exceptions == 4 * 40 and ("DIA_EXCEPTIONS", "1") in layout.defines
    assert "160 entries off them" in layout.describe() and layout.size == 5 * A.shape[0] + 160
    np.testing.assert_array_equal(np.diff(layout.rest_ptr), np.diff(A.indptr) - np.count_nonzero(
        layout._src[:layout.width * A.shape[0]].reshape(5, -1) >= 0, axis=0))
    x = np.random.default_rng(3).standard_normal(A.shape[0])
    val = layout.values(A.data)
    np.testing.assert_allclose(layout.product(val, x), A @ x, rtol=1e-14, atol=1e-13)
    np.testing.assert_array_equal(layout.csr_values(val), A.data)
    assert choose_format(*arrays(torus(8)), np).name == "ell"  # 10% of the entries wrap: too many


# patterns with entries off the diagonals (indptr, indices, how many): the diagonals are the three offsets most
# frequent among the rows, ties to the smaller
OFF_DIAGONAL = {
    "an entry off the diagonals": ([0, 3, 5, 7], [0, 1, 2, 0, 1, 0, 2], 2),
    "columns out of order": ([0, 3, 5, 7], [0, 1, 2, 1, 0, 1, 2], 1),
    "a repeated entry": ([0, 3, 5, 7], [0, 1, 2, 1, 1, 2, 3], 1),
}


@pytest.mark.parametrize("name", OFF_DIAGONAL)
def test_dia_holds_few_entries_off_its_diagonals_and_refuses_more(name, monkeypatch):
    indptr, indices = (np.array(a, dtype=np.int32) for a in OFF_DIAGONAL[name][:2])
    with pytest.raises(DiagonalsDoNotFit, match="lie off them: use the ell, sell or csr matrix format"):
        DIA(indptr, indices, np)
    assert choose_format(indptr, indices, np).name == "ell"  # auto lays it out as ELL instead
    monkeypatch.setattr(DIA, "MAX_EXCEPTIONS", 1.0)
    layout = DIA(indptr, indices, np)
    assert layout.exceptions == OFF_DIAGONAL[name][2] and layout.size == 3 * 3 + layout.exceptions
    data = np.arange(1.0, indices.size + 1)
    A = sp.csr_matrix((data, indices, indptr), shape=(3, 4))  # SciPy sums a repeated entry's values
    x = np.random.default_rng(0).standard_normal(4)
    np.testing.assert_allclose(layout.product(layout.values(data), x), A @ x, rtol=1e-14)


@given(st.integers(3, 40), st.sets(st.integers(-6, 6), min_size=1, max_size=6), st.data())
@settings(max_examples=150, deadline=None)
def test_dia_keeps_what_lies_off_its_diagonals_as_exceptions(n, offsets, data):
    """Rows of random subsets of a band's diagonals: every entry whose offset is not one of DIA's diagonals is an
    exception; rows without one reproduce SciPy's product bit for bit, the others to rounding."""
    offsets = sorted(offsets)
    rows = [[r + d for d in offsets if 0 <= r + d < n and data.draw(st.booleans())] for r in range(n)]
    rows[0] = rows[0] or [0]
    indptr = np.cumsum([0] + [len(r) for r in rows]).astype(np.int32)
    indices = np.array([c for r in rows for c in r], dtype=np.int32)
    with mock.patch.object(DIA, "MAX_EXCEPTIONS", 1.0):
        try:
            layout = DIA(indptr, indices, np)
        except DiagonalsDoNotFit as exc:  # only where no sampled row has an entry
            assert "sampled rows are empty" in str(exc)
            assert all(not rows[r] for r in DIA.sampled_rows(n, min(n, DIA.SAMPLES)))
            return
    diagonals = set(layout.diagonals.tolist())
    off = [[c for c in r if c - i not in diagonals] for i, r in enumerate(rows)]
    assert layout.width <= max(len(r) for r in rows) and layout.exceptions == sum(map(len, off))
    A = sp.csr_matrix((np.random.default_rng(n).standard_normal(indices.size), indices, indptr), shape=(n, n))
    x = np.random.default_rng(1).standard_normal(n)
    got, expected = layout.product(layout.values(A.data), x), A @ x
    plain = np.array([not r for r in off])
    np.testing.assert_array_equal(got[plain], expected[plain])
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-13)


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


def slice_widths_sorted_together(lengths, lanes):
    """Slots of the slices when every row of at most SELL.LONG_ROW entries is sorted by length together."""
    short = np.sort(lengths[lengths <= SELL.LONG_ROW])[::-1]
    first = short[::32 // lanes]  # a slice's first row is its longest
    return 32 * (-(-first // lanes))


@pytest.mark.parametrize("row_order", ["length", "neighbours"])
@pytest.mark.parametrize("lanes", [1, 4])
def test_sell_rows_sorted_by_length_within_windows(row_order, lanes):
    A = random_geometric_laplacian(20000, seed=1)
    layout = SELL(*arrays(A), np, lanes=lanes, row_order=row_order)
    lengths = np.diff(A.indptr)
    rows = layout.slice_rows[::lanes]
    slot_len = np.where(rows >= 0, lengths[np.maximum(rows, 0)], 0)
    for w in range(0, rows.size, layout.sigma):  # non-increasing within each window
        chunk = slot_len[w:w + layout.sigma]
        assert np.all(np.diff(chunk[rows[w:w + layout.sigma] >= 0]) <= 0)
    assert sorted(rows[rows >= 0].tolist()) == list(range(A.shape[0]))  # every row once
    if row_order == "neighbours":
        assert layout.sigma == SELL.NEIGHBOUR_WINDOW
        return
    # every row sorted together: the slices are those of the sorted lengths, the least padding there is
    widths = slice_widths_sorted_together(lengths, lanes)
    assert layout.sigma == A.shape[0]
    np.testing.assert_array_equal(np.diff(layout.slice_ptr), widths)
    assert layout.padding == (widths.sum() - A.nnz) / A.nnz


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


def test_sell_rows_by_length_give_slices_of_falling_width_then_the_long_rows_longest_first():
    A = power_law_laplacian(100000, seed=1)
    layout = SELL(*arrays(A), np, lanes=2, row_order="length")
    lengths = np.diff(A.indptr)
    assert np.all(np.diff(np.diff(layout.slice_ptr)) <= 0)  # the warps, taking slices in turn, share alike
    long_rows = np.flatnonzero(lengths > SELL.LONG_ROW)
    np.testing.assert_array_equal(layout.long_rows, long_rows[np.argsort(-lengths[long_rows], kind="stable")])
    np.testing.assert_array_equal(np.diff(layout.row_pieces), -(-lengths[layout.long_rows] // SELL.PIECE_LENGTH))
    np.testing.assert_allclose(layout.product(layout.values(A.data), np.arange(A.shape[0]) % 7.0),
                               A @ (np.arange(A.shape[0]) % 7.0))


def test_neighbours_order_is_a_permutation_that_draws_neighbours_together():
    A = random_geometric_laplacian(20000, seed=1)
    ip, ix = arrays(A)
    order = neighbours_order(ip, ix, np, 4, SELL.LONG_ROW)
    assert order.dtype == np.int32 and sorted(order.tolist()) == list(range(A.shape[0]))
    first = neighbours_order(ip, ix, np, 1, SELL.LONG_ROW)
    # one pass sorts the rows by their least column, ties by row
    least = np.minimum.reduceat(ix, ip[:-1])
    np.testing.assert_array_equal(first, np.lexsort((np.arange(A.shape[0]), least)))
    rank = np.empty(A.shape[0], dtype=np.int64)
    rank[order] = np.arange(A.shape[0])
    given = window_sectors(ip, ix, np.arange(A.shape[0]), 256, np)
    renumbered = window_sectors(ip, ix, order, 256, np, renumber=rank)
    assert renumbered < 0.25 * given
    B = one_long_row(n=300, length=2000)
    assert neighbours_order(*arrays(B), np, 2, SELL.LONG_ROW)[-1] == 150  # the long row last


@pytest.mark.parametrize("name", ["empty_rows", "one_long_row"])
def test_sell_neighbour_key_is_the_least_rank_of_a_short_rows_columns(name):
    A = MATRICES[name]()
    rank = np.random.default_rng(1).permutation(A.shape[0]).astype(np.int32)
    key = neighbour_key(*arrays(A), rank, SELL.LONG_ROW)
    for r in range(A.shape[0]):
        cols = A.indices[A.indptr[r]:A.indptr[r + 1]]
        expected = A.shape[0] + 1 if cols.size > SELL.LONG_ROW else rank[cols].min() if cols.size else A.shape[0]
        assert key[r] == expected


@pytest.mark.parametrize("name", MATRICES)
def test_sell_rows_by_neighbours_reproduce_the_product(name):
    A = MATRICES[name]()
    layout = SELL(*arrays(A), np, row_order="neighbours")
    x = np.random.default_rng(0).standard_normal(A.shape[1])
    np.testing.assert_allclose(layout.product(layout.values(A.data), x), A @ x, rtol=1e-13, atol=1e-12)


@pytest.mark.parametrize("name", MATRICES)
def test_sell_renumbered_rows_reproduce_the_product_in_its_numbering(name):
    A = MATRICES[name]()
    layout = SELL(*arrays(A), np, row_order="neighbours", renumber=True)
    order = layout.numbering
    assert sorted(order.tolist()) == list(range(A.shape[0]))
    assert np.array_equal(layout.places[order], np.arange(A.shape[0]))  # each row's number: its place
    x = np.random.default_rng(0).standard_normal(A.shape[1])
    got = layout.product(layout.values(A.data), x[order])  # x and the product in the layout's numbering
    np.testing.assert_allclose(got, (A @ x)[order], rtol=1e-13, atol=1e-12)
    lanes_rows = layout.slice_rows[::layout.lanes]
    short = int((lanes_rows >= 0).sum())
    assert np.array_equal(lanes_rows[:short], np.arange(short))  # the slices hold consecutive rows
    assert np.array_equal(layout.long_rows, np.arange(short, A.shape[0]))
    assert "rows numbered as laid out" in layout.describe()


LARGER = {"geometric 20k": lambda: random_geometric_laplacian(20000, seed=2),
          "power-law 20k": lambda: power_law_laplacian(20000, seed=3)}  # scattered at the sample's scale


@pytest.mark.parametrize("name, row_order, numbered", [
    ("geometric 20k", "auto", True), ("geometric 20k", "length", False),  # rows by length asked for: as given
    ("power-law 20k", "auto", True),  # rows by length over a scattered numbering: renumbered too
    ("geometric", "auto", False), ("poisson2d", "auto", False)])  # local at the sample's scale: kept
def test_sell_renumbers_by_neighbours_or_over_a_scattered_numbering(name, row_order, numbered):
    A = {**MATRICES, **LARGER}[name]()
    layout = SELL(*arrays(A), np, row_order=row_order, renumber=True)
    assert (layout.numbering is not None) == numbered
    lanes = SELL.auto_lanes(A.nnz, A.shape[0])
    assert layout.lanes == (min(lanes, SELL.NUMBERED_LANES) if numbered else lanes)
    if numbered and layout.row_order == "length":
        assert layout.sectors[0] > SELL.SCATTERED
    x = np.random.default_rng(1).standard_normal(A.shape[0])
    order = np.arange(A.shape[0]) if layout.numbering is None else layout.numbering
    got = layout.product(layout.values(A.data), x[order])
    np.testing.assert_allclose(got, (A @ x)[order], rtol=1e-13, atol=1e-12)


def test_sell_rows_of_a_rectangular_matrix_keep_their_length_order():
    A = rectangular()
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


@pytest.mark.parametrize("warps", [40, 64, 96])
def test_sell_stage_steps_deal_the_slices_as_the_kernel_does(warps):
    """The most steps (a header and the entry steps of each slice) one warp stages, with the slices dealt
    to warps as ``WorkItems`` in kernels/sell.cu deals them: a slice a warp a round, odd rounds from the
    last warp down."""
    layout = SELL(*arrays(one_long_row(n=3000)), np, lanes=2)
    assert layout.pieces > 0 and layout.slices > 2 * warps
    steps = np.diff(layout.slice_ptr) // 32 + 1
    need, dealt = np.zeros(warps, dtype=int), []
    for warp in range(warps):
        for round_ in itertools.count():
            s = round_ * warps + (warps - 1 - warp if round_ % 2 else warp)
            if s >= layout.slices:
                break
            need[warp] += steps[s]
            dealt.append(s)
    assert sorted(dealt) == list(range(layout.slices))
    assert layout.stage_steps(warps) == need.max()
    assert ELL(*arrays(poisson((10, 10))), np).stage_steps(warps) is None


def test_csr_lanes_follow_mean_row_length():
    assert row_lanes(7 * 100, 100) == 8 and row_lanes(3 * 100, 100) == 4 and row_lanes(100, 100) == 2
    assert row_lanes(1000 * 10, 10) == 32
    A = power_law_laplacian(1000, seed=0)
    layout = CSR(*arrays(A), np)
    assert layout.lanes == row_lanes(A.nnz, 1000)
    np.testing.assert_array_equal(layout.values(A.data), A.data)


def rectangular():
    return sp.csr_matrix(sp.random(300, 1000, density=0.02, random_state=np.random.default_rng(1)))


@pytest.mark.parametrize("name", [*MATRICES, "rectangular"])
def test_pattern_stats_count_entries_longest_row_long_rows_and_columns(name):
    A = rectangular() if name == "rectangular" else MATRICES[name]()
    lengths = np.diff(A.indptr)
    expected = Pattern(A.nnz, int(lengths.max()), int((lengths > 64).sum()), int(A.indices.max()) + 1)
    assert pattern_stats(*arrays(A), np, 64, columns=True) == expected
    assert pattern_stats(*arrays(A), np, 64) == expected._replace(columns=0)


# (row pointers, column indices, canonical: rows' columns strictly increasing, pointers not decreasing)
CANONICAL_CASES = {
    "sorted": ([0, 2, 3], [0, 1, 1], True),
    "unsorted row": ([0, 2, 3], [1, 0, 1], False),
    "duplicate": ([0, 2, 3], [1, 1, 0], False),
    "falling only across rows": ([0, 2, 4], [2, 3, 0, 1], True),
    "empty rows first, between and last": ([0, 0, 2, 2, 3, 3], [0, 1, 0], True),
    "unsorted before empty last rows": ([0, 2, 2, 2], [1, 0], False),
    "one entry": ([0, 1], [0], True),
    "decreasing pointers": ([0, 2, 1, 3], [0, 1, 0], False),
    "no entries": ([0, 0, 0], [], True),
}


def test_entry_rows_skip_empty_rows():
    assert entry_rows(np.array([0, 0, 2, 2, 2, 5, 5]), np).tolist() == [1, 1, 4, 4, 4]


@pytest.mark.parametrize("name", CANONICAL_CASES)
def test_increasing_rows_tells_canonical_patterns(name):
    indptr, indices, expected = CANONICAL_CASES[name]
    assert increasing_rows(np.array(indptr), np.array(indices, dtype=np.int32), np) is expected


@given(st.lists(st.lists(st.integers(0, 6), max_size=6), min_size=1, max_size=8))
@settings(max_examples=200, deadline=None)
def test_increasing_rows_agrees_with_scipy(rows):
    indptr = np.cumsum([0] + [len(r) for r in rows])
    indices = np.array([c for r in rows for c in r], dtype=np.int32)
    A = sp.csr_matrix((np.ones(indices.size), indices, indptr), shape=(len(rows), 7))
    assert increasing_rows(indptr, indices, np) is bool(A.has_canonical_format)
    assert increasing_rows(indptr, indices, np) is all(all(a < b for a, b in zip(r, r[1:])) for r in rows)


def test_unknown_format_is_refused():
    with pytest.raises(InputError, match="matrix format must be auto or one of dia, ell, sell, csr"):
        choose_format(*arrays(poisson((4, 4))), np, "bsr")


@pytest.mark.gpu
@pytest.mark.parametrize("row_order, renumber", [("auto", False), ("length", False), ("neighbours", False),
                                                ("neighbours", True)])
@pytest.mark.parametrize("lanes", [1, 2, 4, 8])
@pytest.mark.parametrize("name", ["geometric", "power_law", "one_long_row", "empty_rows"])
def test_sell_layout_kernels_equal_the_numpy_layout(cupy, name, lanes, row_order, renumber):
    A = MATRICES[name]()
    ref = SELL(*arrays(A), np, lanes=lanes, row_order=row_order, renumber=renumber)
    dev = SELL(*(cupy.asarray(a) for a in arrays(A)), cupy, lanes=lanes, row_order=row_order, renumber=renumber)
    assert (dev.sigma, dev.size, dev.slices, dev.pieces) == (ref.sigma, ref.size, ref.slices, ref.pieces)
    assert (dev.row_order, dev.sectors, dev.padding) == (ref.row_order, ref.sectors, ref.padding)
    assert (dev.numbering is None) == (ref.numbering is None) == (not renumber)
    if renumber:
        np.testing.assert_array_equal(dev.numbering.get(), ref.numbering)
        np.testing.assert_array_equal(dev.places.get(), ref.places)
    for field in ("_src", "col", "slice_ptr", "slice_rows", "piece_ptr", "piece_row", "long_rows", "row_pieces"):
        np.testing.assert_array_equal(getattr(dev, field).get(), getattr(ref, field), err_msg=field)
    np.testing.assert_array_equal(dev.values(cupy.asarray(A.data)).get(), ref.values(A.data))


@pytest.mark.gpu
def test_sell_sizes_scan_over_several_rounds_a_block_equals_numpy(cupy):
    # 4 rows a slice over 600k rows: 150k slices, more than the build's blocks (a few hundred) scan in one
    # round of 256 each
    A = power_law_laplacian(600_000, seed=5)
    ref = SELL(*arrays(A), np, lanes=8, row_order="length")
    dev = SELL(*(cupy.asarray(a) for a in arrays(A)), cupy, lanes=8, row_order="length")
    assert dev.slices == ref.slices > 100_000 and (dev.size, dev.pieces) == (ref.size, ref.pieces)
    for field in ("slice_ptr", "row_pieces", "piece_ptr", "long_rows", "_src"):
        np.testing.assert_array_equal(getattr(dev, field).get(), getattr(ref, field), err_msg=field)


@pytest.mark.gpu
@pytest.mark.parametrize("name", LARGER)
def test_sell_numbered_layout_on_the_device_is_numpys(cupy, name):
    A = LARGER[name]()
    ref = SELL(*arrays(A), np, row_order="auto", renumber=True)
    dev = SELL(*(cupy.asarray(a) for a in arrays(A)), cupy, row_order="auto", renumber=True)
    assert (dev.row_order, dev.sectors) == (ref.row_order, ref.sectors) and ref.numbering is not None
    for field in ("numbering", "places", "_src", "col", "slice_ptr", "slice_rows", "piece_ptr", "long_rows"):
        np.testing.assert_array_equal(getattr(dev, field).get(), getattr(ref, field), err_msg=field)


def test_copy_into_copies_or_refuses_a_mismatch():
    out = np.zeros(4, dtype=np.int32)
    copy_into(out, np.arange(4, dtype=np.int32))
    np.testing.assert_array_equal(out, np.arange(4))
    for wrong in (np.arange(3, dtype=np.int32), np.arange(4, dtype=np.int64), np.arange(8, dtype=np.int32)[::2]):
        with pytest.raises(ValueError, match="copy_into"):
            copy_into(out, wrong)


@pytest.mark.gpu
def test_a_sell_layout_holds_nothing_of_its_build(cupy):
    # the orders and sizes are copied out of the build's buffers, which are freed with it: every array the layout
    # keeps lies in one allocation of its own, and the pool holds nothing else for it, whatever its row order
    pool = cupy.get_default_memory_pool()
    for A, rows in ((power_law_laplacian(20_000, seed=3), "auto"), (random_geometric_laplacian(20_000), "auto"),
                    (random_geometric_laplacian(20_000), "length")):
        indptr, indices = (cupy.asarray(a.astype(np.int32)) for a in (A.indptr, A.indices))
        pool.free_all_blocks()
        before = pool.used_bytes()
        layout = SELL(indptr, indices, cupy, row_order=rows, renumber=True)
        kept = [getattr(layout, name) for name in ("col", "_src", "slice_rows", "slice_ptr", "row_pieces",
                                                   "long_rows", "piece_ptr", "piece_row", "tickets")]
        kept += [layout.numbering, layout.places] if layout.numbering is not None else []
        allocations = {a.data.mem.ptr for a in kept}
        assert len(allocations) == 1, (rows, [(a.size, a.data.mem.ptr, a.data.mem.size) for a in kept])
        assert pool.used_bytes() - before == kept[0].data.mem.size, (rows, pool.used_bytes() - before,
                                                                      kept[0].data.mem.size)
        del layout, kept  # freed before the next case measures


@pytest.mark.gpu
@pytest.mark.parametrize("n, bound", [(1, 0), (1000, 1), (1025, 255), (1025, 256), (5000, 65), (50_001, 50_001),
                                      (300_000, 300_001), (300_000, 2**31 - 1), (2**20, 2**20 - 1)])
def test_the_builds_sort_is_numpys_stable_argsort(cupy, n, bound):
    # many ties (keys drawn from few values unless the bound is large), tiles of several chunks (300k keys:
    # 293 tiles of 1024; 2^20 keys: the most tiles, 1024, every warp of the prefix's blocks), one to four
    # passes of 8 bits
    rng = np.random.default_rng(n + bound)
    values = rng.integers(0, bound + 1, size=max(n // 7, 1))
    key = rng.choice(values, size=n).astype(np.int32)
    key[rng.integers(0, n)] = bound  # the largest key is sorted by the last pass
    rows = cupy.arange(n + 1, dtype=cupy.int32)  # a diagonal pattern of n rows
    build = LayoutBuild(rows, rows[:n], n, SELL.LONG_ROW)
    phases, order = build.sorted_by(cupy.asarray(key), bound)
    build.run(phases)
    np.testing.assert_array_equal(order.get(), np.argsort(key, kind="stable"))


@pytest.mark.gpu
def test_entry_rows_on_the_device_are_numpys(cupy):
    hub = power_law_laplacian(5000, seed=1)
    cases = [np.array([0, 0, 2, 2, 2, 5, 5]), np.array([0, 3]), np.array([0, 0, 0]), hub.indptr]
    for indptr in cases:
        for dtype in (np.int32, np.int64):
            expected = entry_rows(indptr.astype(dtype), np)
            np.testing.assert_array_equal(entry_rows(cupy.asarray(indptr, dtype=dtype), cupy).get(), expected)


@pytest.mark.gpu
def test_increasing_rows_on_the_device_is_numpys(cupy):
    hub = power_law_laplacian(5000, seed=1)  # a row of thousands of entries
    cases = [(ip, ix) for ip, ix, _ in CANONICAL_CASES.values()] + [(hub.indptr, hub.indices)]
    swapped = hub.indices.copy()
    start = int(hub.indptr[np.argmax(np.diff(hub.indptr))])
    swapped[start + 1000], swapped[start + 1001] = swapped[start + 1001], swapped[start + 1000]
    cases.append((hub.indptr, swapped))
    for indptr, indices in cases:
        indptr, indices = np.array(indptr), np.array(indices, dtype=np.int32)
        on_device = increasing_rows(cupy.asarray(indptr), cupy.asarray(indices), cupy)
        assert on_device is increasing_rows(indptr, indices, np)
    assert not increasing_rows(hub.indptr, swapped, np)


@pytest.mark.gpu
@pytest.mark.parametrize("name", [*MATRICES, "rectangular"])
def test_pattern_stats_kernel_equals_numpy(cupy, name):
    A = rectangular() if name == "rectangular" else MATRICES[name]()
    for columns in (False, True):
        expected = pattern_stats(*arrays(A), np, SELL.LONG_ROW, columns)
        assert pattern_stats(*(cupy.asarray(a) for a in arrays(A)), cupy, SELL.LONG_ROW, columns) == expected


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["poisson2d", "poisson3d", "stencil27", "banded rectangular", "torus", "geometric",
                                  *OFF_DIAGONAL])
def test_dia_layout_kernels_equal_the_numpy_layout(cupy, name, monkeypatch):
    if name in OFF_DIAGONAL:
        monkeypatch.setattr(DIA, "MAX_EXCEPTIONS", 1.0)
        indptr, indices, _ = OFF_DIAGONAL[name]
        A = sp.csr_matrix((np.arange(1.0, len(indices) + 1), indices, indptr), shape=(3, 4))
    else:
        A = {"banded rectangular": banded_rectangular, "torus": lambda: torus(40)}.get(
            name, MATRICES.get(name))()
    pattern = (A.indptr.astype(np.int32), A.indices.astype(np.int32))
    try:
        ref = DIA(*pattern, np)
    except DiagonalsDoNotFit as exc:
        with pytest.raises(DiagonalsDoNotFit) as on_device:
            DIA(*(cupy.asarray(a) for a in pattern), cupy)
        assert str(on_device.value) == str(exc)  # the same diagonals and count of exceptions
        return
    dev = DIA(*(cupy.asarray(a) for a in pattern), cupy)
    assert (dev.width, dev.size, dev.nnz, dev.columns, dev.exceptions) == (ref.width, ref.size, ref.nnz,
                                                                          ref.columns, ref.exceptions)
    assert dev.defines == ref.defines
    np.testing.assert_array_equal(dev.offsets, ref.offsets)
    np.testing.assert_array_equal(dev._src.get(), ref._src)
    for field in ("rest_ptr", "rest_col"):
        got, expected = getattr(dev, field), getattr(ref, field)
        assert (got is None) == (expected is None), field
        if got is not None:
            np.testing.assert_array_equal(got.get(), expected, err_msg=field)
    np.testing.assert_array_equal(dev.values(cupy.asarray(A.data)).get(), ref.values(A.data))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["poisson2d", "poisson3d", "stencil27", "geometric", "empty_rows"])
def test_ell_layout_kernel_equals_the_numpy_layout(cupy, name):
    A = MATRICES[name]()
    ref = ELL(*arrays(A), np)
    dev = ELL(*(cupy.asarray(a) for a in arrays(A)), cupy)
    assert (dev.width, dev.size, dev.nnz) == (ref.width, ref.size, ref.nnz)
    for field in ("_src", "col"):
        np.testing.assert_array_equal(getattr(dev, field).get(), getattr(ref, field), err_msg=field)
    np.testing.assert_array_equal(dev.values(cupy.asarray(A.data)).get(), ref.values(A.data))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["geometric", "power_law", "one_long_row", "empty_rows"])
@pytest.mark.parametrize("passes", [1, 4])
def test_neighbours_order_on_the_device_is_numpys(cupy, name, passes):
    A = MATRICES[name]()
    got = neighbours_order(*(cupy.asarray(a) for a in arrays(A)), cupy, passes, SELL.LONG_ROW, SELL.NEIGHBOUR_WINDOW)
    np.testing.assert_array_equal(got.get(), neighbours_order(*arrays(A), np, passes, SELL.LONG_ROW,
                                                              SELL.NEIGHBOUR_WINDOW))


@pytest.mark.gpu
def test_builds_of_every_shared_memory_size_launch_in_any_order(cupy):
    # the neighbours' order alone takes a window's shared memory, SELL's sample a hash table: one kernel
    # function serves both, whichever comes first
    A = MATRICES["geometric"]()
    indptr, indices = (cupy.asarray(a) for a in arrays(A))
    for _ in range(2):
        order = neighbours_order(indptr, indices, cupy, 2, SELL.LONG_ROW, SELL.NEIGHBOUR_WINDOW)
        assert SELL(indptr, indices, cupy, row_order="auto").sectors is not None
        np.testing.assert_array_equal(order.get(), neighbours_order(*arrays(A), np, 2, SELL.LONG_ROW,
                                                                    SELL.NEIGHBOUR_WINDOW))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["geometric", "power_law", "one_long_row", "empty_rows", "big_geometric"])
def test_the_builds_sample_counts_the_sectors_the_numpy_path_counts(cupy, name):
    A = random_geometric_laplacian(20000, seed=1) if name == "big_geometric" else MATRICES[name]()  # 79 windows
    ref = SELL(*arrays(A), np, row_order="auto")
    dev = SELL(*(cupy.asarray(a) for a in arrays(A)), cupy, row_order="auto")
    assert dev.sectors == ref.sectors and ref.sectors[0] > 0


@pytest.mark.gpu
def test_sell_rows_of_a_rectangular_matrix_keep_their_length_order_on_the_device(cupy):
    A = rectangular()
    indptr, indices = (cupy.asarray(a) for a in arrays(A))
    assert SELL(indptr, indices, cupy, row_order="auto").row_order == "length"
    with pytest.raises(InputError, match="need a square matrix"):
        SELL(indptr, indices, cupy, row_order="neighbours")


# -- random patterns (tests/fuzzing.py) ------------------------------------------------------------
SELL_OPTIONS = st.fixed_dictionaries({"lanes": st.sampled_from((None, 1, 2, 4, 8)),
                                      "row_order": st.sampled_from(("auto", "neighbours", "length")),
                                      "renumber": st.booleans()})
# the arrays a layout is made of, where it has its own (CSR keeps the pattern's)
LAYOUT_ARRAYS = {"dia": ("_src", "rest_ptr", "rest_col"), "ell": ("_src", "col"),
                 "sell": ("_src", "col", "slice_ptr", "slice_rows", "piece_ptr", "piece_row", "long_rows",
                          "row_pieces", "numbering", "places")}


def random_layout(A, fmt, options, xp):
    """``A``'s layout in ``fmt`` (SELL with ``options``) built with ``xp``; None where the format refuses ``A``
    (then for the reason it gives)."""
    pattern = tuple(xp.asarray(a) for a in arrays(A))
    lengths = np.diff(A.indptr)
    try:
        if fmt == "sell":
            return SELL(*pattern, xp, **options)
        return choose_format(*pattern, xp, fmt)
    except DiagonalsDoNotFit:
        assert fmt == "dia"
    except InputError as exc:  # ELL and DIA hold rows of 1 to 64 entries
        assert fmt in ("ell", "dia") and f"{fmt.upper()} needs rows" in str(exc)
        assert lengths.max() > ELL.MAX_WIDTH or lengths.min() == 0
    return None


@given(A=spd_matrices(), fmt=st.sampled_from(("auto", "dia", "ell", "sell", "csr")), options=SELL_OPTIONS)
@fuzz(200)
def test_random_patterns_every_layout_reproduces_the_product(A, fmt, options):
    """Every format (SELL with every lane count, row order and numbering) over random row-length profiles:
    the product in the layout's numbering, every row laid out once, the values back in CSR order."""
    layout = random_layout(A, fmt, options, np)
    if layout is None:
        return
    n = A.shape[0]
    order = np.arange(n) if layout.numbering is None else layout.numbering
    if layout.numbering is not None:
        assert np.array_equal(np.sort(order), np.arange(n)) and np.array_equal(layout.places[order], np.arange(n))
    x = np.random.default_rng(n).standard_normal(n)
    val = layout.values(A.data)
    np.testing.assert_allclose(layout.product(val, x[order]), (A @ x)[order], rtol=1e-13, atol=1e-12)
    np.testing.assert_array_equal(layout.csr_values(val), A.data)
    if layout.name == "sell":
        rows = layout.slice_rows.reshape(-1, layout.lanes)
        assert np.all(rows == rows[:, :1])  # the lanes of a row agree on it
        laid_out = np.concatenate([rows[:, 0][rows[:, 0] >= 0], layout.long_rows])
        assert np.array_equal(np.sort(laid_out), np.arange(n))  # every row once, in a slice or in pieces
        long = np.diff(A.indptr)[order] > SELL.LONG_ROW
        assert np.array_equal(np.sort(layout.long_rows), np.flatnonzero(long))
        assert np.all(np.diff(layout.piece_ptr) <= SELL.PIECE_LENGTH)


@pytest.mark.gpu
@given(A=spd_matrices(), fmt=st.sampled_from(("dia", "ell", "sell")), options=SELL_OPTIONS)
@fuzz(60)
def test_random_patterns_device_layouts_are_numpys(cupy, A, fmt, options):
    """The layout kernels over random row-length profiles: every array, the sizes and the values NumPy's."""
    ref = random_layout(A, fmt, options, np)
    dev = random_layout(A, fmt, options, cupy)
    assert (dev is None) == (ref is None)
    if ref is None:
        return
    assert (dev.size, dev.nnz, dev.describe(), dev.defines) == (ref.size, ref.nnz, ref.describe(), ref.defines)
    for field in LAYOUT_ARRAYS[fmt]:
        got, expected = getattr(dev, field, None), getattr(ref, field, None)
        assert (got is None) == (expected is None), field
        if got is not None:
            np.testing.assert_array_equal(got.get(), expected, err_msg=field)
    np.testing.assert_array_equal(dev.values(cupy.asarray(A.data)).get(), ref.values(A.data))
