"""SELL-C-sigma with long rows split into pieces (``kernels/sell.cu``)."""
import numpy as np

from ..errors import InputError
from ..kernels.structs import Struct
from . import base
from .base import (RADIX_SORT, SORT_DEFINES, SORT_THREADS, MatrixFormat, carve, cooperative_kernel, copy_into,
                   entry_rows, host, pattern_stats, radix_sort_fields, radix_sort_size, window_sectors)

SLICE = 32  # rows a slice: one warp, a thread a row
PLACE_WARPS = 4  # warps a block of the placing kernel (sell_place): 34 KiB of shared memory at one lane a row
# The arguments of the layout kernels (kernels/sell_layout.cu), one struct each.
ROWS = Struct("SellRows", [("n", "int"), ("long_row", "int"), ("indptr", "const int*"), ("key", "int*"),
                           ("rank", "int*")])
KEY = Struct("SellKey", [("n", "int"), ("long_row", "int"), ("indptr", "const int*"), ("indices", "const int*"),
                         ("rank", "const int*"), ("key", "int*")])
SAMPLE = Struct("SellSample", [("n", "int"), ("rows", "int"), ("window", "int"), ("samples", "int"),
                               ("table", "int"), ("itemsize", "int"), ("long_row", "int"), ("indptr", "const int*"),
                               ("indices", "const int*"), ("grouped", "const int*"), ("counts", "unsigned int*")])
RANKS = Struct("SellRanks", [("n", "int"), ("rows", "int"), ("order", "const int*"), ("rank", "int*")])
WINDOW = Struct("SellWindow", [("n", "int"), ("rows", "int"), ("window", "int"), ("indptr", "const int*"),
                               ("order", "const int*"), ("sorted", "int*")])
SIZES = Struct("SellSizes", [("rows", "int"), ("lanes", "int"), ("slices", "int"), ("longs", "int"),
                             ("piece_length", "int"), ("indptr", "const int*"), ("order", "const int*"),
                             ("counts", "long long*"), ("scan", "long long*"), ("slice_ptr", "int*"),
                             ("long_start", "int*"), ("row_pieces", "int*"), ("totals", "long long*")])
PIECES = Struct("SellPieces", [("longs", "int"), ("pieces", "int"), ("sliced", "int"), ("piece_length", "int"),
                               ("long_start", "const int*"), ("row_pieces", "const int*"), ("piece_ptr", "int*"),
                               ("piece_row", "int*")])
LAYOUT = Struct("SellLayout", [("lanes", "int"), ("rows", "int"), ("positions", "int"), ("sliced", "int"),
                               ("indptr", "const int*"), ("indices", "const int*"), ("order", "const int*"),
                               ("slice_ptr", "const int*"), ("long_start", "const int*"), ("long_rows", "const int*"),
                               ("longs", "int"), ("places", "const int*"), ("max_steps", "int"), ("col", "int*"),
                               ("src", "int*"), ("slice_rows", "int*")])
LONGS = Struct("SellLongs", [("rows", "int"), ("longs", "int"), ("width", "int"), ("indptr", "const int*"),
                             ("order", "int*"), ("key", "int*"), ("sorted", "const int*")])
# The phases of the set-up's cooperative kernel (sell_build), numbered for the kernel's PHASE_ constants.
PHASES = {name: number for number, name in enumerate(
    ("rows", "key", "sort", "sample", "ranks", "window", "long_keys", "long_rows", "counts", "scan_sums", "scan",
     "offsets"))}
SORTS = {"neighbours": 0, "length": 1, "long": 2}  # which sort a "sort" phase runs
MAX_PHASES = 24
BUILD = Struct("SellBuild", [("rows", ROWS), ("key", KEY), ("neighbour_sort", RADIX_SORT),
                             ("length_sort", RADIX_SORT), ("long_sort", RADIX_SORT), ("sample", SAMPLE),
                             ("ranks", RANKS), ("places", RANKS), ("window", WINDOW), ("longs", LONGS),
                             ("sizes", SIZES), ("block_sums", "long long*"), ("counter", "unsigned long long*"),
                             ("count", "int"), ("phases", f"int[{MAX_PHASES}]"), ("args", f"int[{MAX_PHASES}]")])
LAYOUT_STRUCTS = (ROWS, KEY, SAMPLE, RANKS, WINDOW, SIZES, PIECES, LAYOUT, LONGS, BUILD)
LAYOUT_PROGRAM = dict(structs=LAYOUT_STRUCTS, before=("sort",), defines=SORT_DEFINES + tuple(
    (f"PHASE_{name.upper()}", str(number)) for name, number in PHASES.items()))
ROW_ORDERS = ("auto", "neighbours", "length")


def layout_kernel(name):
    """A kernel of ``kernels/sell_layout.cu`` (compiled once a process)."""
    return base.layout_kernel("sell_layout", name, **LAYOUT_PROGRAM)


def launch(name, items, struct, **fields):
    """Run the grid-stride kernel ``name`` of ``kernels/sell_layout.cu`` over ``items``."""
    layout_kernel(name)((base.stride_grid(items),), (256,), (struct.pack(**fields),))


def offsets(counts):
    """``[0, counts[0], counts[0] + counts[1], ...]`` in int64 (NumPy)."""
    return np.concatenate((np.zeros(1, dtype=np.int64), np.cumsum(counts, dtype=np.int64)))


# -- the NumPy meaning of the build's phases (kernels/sell_layout.cu) ------------------------------------
def row_keys(indptr, long_row):
    """``(length_key, rank)``: each row's sort key by length (``long_row`` - length for a short row,
    so that a stable sort puts the longest first, ``long_row`` + 1 for a long one, after them) and its
    first rank for the neighbours' order (the row itself, n for a long row): the "rows" phase."""
    n = int(indptr.size) - 1
    lengths = np.diff(indptr)
    is_long = lengths > long_row
    length_key = np.where(is_long, long_row + 1, long_row - lengths).astype(np.int32)
    return length_key, np.where(is_long, n, np.arange(n)).astype(np.int32)


def neighbour_key(indptr, indices, rank, long_row):
    """Least ``rank`` of each row's columns, ``n`` for an empty row, ``n + 1`` for a row over ``long_row``
    entries (long rows take no part in the order and sort after the others): the "key" phase."""
    n = int(indptr.size) - 1
    values = np.append(rank[indices], np.int32(n))
    least = np.minimum.reduceat(values, indptr[:-1]) if n else values[:0]
    length = np.diff(indptr)
    return np.where(length > long_row, n + 1, np.where(length > 0, least, n)).astype(np.int32)


def order_ranks(order, short):
    """The position of each row in ``order``, ``n`` for a long one (positions from ``short`` on): the "ranks"
    phase."""
    n = int(order.size)
    rank = np.full(n, n, dtype=np.int32)
    rank[order[:short]] = np.arange(short, dtype=np.int32)
    return rank


def neighbour_pass(indptr, indices, rank, long_row):
    """One pass of the neighbours' order: the rows sorted by the least ``rank`` of their columns, ties
    by row (int32): the "key" and "sort" phases."""
    return stable_argsort(neighbour_key(indptr, indices, rank, long_row))


def window_sort(indptr, order, short, window, long_row):
    """``order`` (its first ``short`` rows the short ones) sorted by length, longest first, within each
    window of ``window`` positions, ties in their order; the long rows after every window, in theirs: the
    "window" phase (a block a window)."""
    n = int(indptr.size) - 1
    last = -(-short // window) * (long_row + 1)  # above every short row's key
    position = np.arange(n, dtype=np.int64)
    lengths = np.diff(indptr)[order]
    key = np.where(position < short, position // window * (long_row + 1) + long_row - lengths, last)
    return order[stable_argsort(key)]


def neighbours_order(indptr, indices, xp, passes, long_row, window=None):
    """The rows of a square CSR pattern in the order ``passes`` passes of the neighbours' sort give
    (:meth:`SELL._neighbour_order`'s): rows sharing a neighbour adjacent, groups of them drawn together
    pass by pass, then with ``window`` sorted by length within windows of that many rows
    (:func:`window_sort`, as SELL lays its rows out); rows over ``long_row`` entries last, in their
    order. Where the arrays are (NumPy or CuPy), the same order: on the device one launch of the build."""
    n = int(indptr.size) - 1
    short = n - pattern_stats(indptr, indices, xp, long_row).longs
    if xp is not np:
        build = LayoutBuild(indptr, indices, short, long_row)
        build.run([("rows", 0)] + build.neighbour_passes(passes) + ([("window", 0)] if window else []))
        return build.ordered if window else build.grouped
    _, rank = row_keys(indptr, long_row)
    order = np.arange(n, dtype=np.int32)
    for done in range(passes):
        order = neighbour_pass(indptr, indices, rank, long_row)
        if done + 1 < passes:
            rank = order_ranks(order, short)
    return order if window is None else window_sort(indptr, order, short, window, long_row)


def stable_argsort(key):
    """Indices (int32) that sort ``key``, ties in their given order (NumPy; the "sort" phase's meaning)."""
    return np.argsort(key, kind="stable").astype(np.int32)


class LayoutBuild:
    """SELL's set-up on the device: its buffers, and the phases of ``sell_build`` (``kernels/sell_layout.cu``)
    run by cooperative launches, a grid barrier after each phase and nothing read back in between.

    Three allocations hold every buffer: one of int32 (the rows' keys and ranks, the orders, the sorts'
    buffers, the sizes' offsets), one of int64 (the scan's), one zeroed (the launches' barrier counters,
    the sample's counts). :attr:`fields` are the build's struct fields, packed as the steps set them.

    Parameters
    ----------
    indptr, indices : CuPy int32 arrays
        A CSR pattern of ``n`` rows.
    short : int
        Its rows of at most ``long_row`` entries.
    long_row : int
    window : int
        Rows a window of the neighbours' order, as many as a block's threads.
    samples, table : int
        The sample's windows, and the slots of its hash table (``sample_window`` in the kernel file).
    width : int
        The longest row (the long rows' sort keys' bound).
    """

    def __init__(self, indptr, indices, short, long_row, window=SORT_THREADS, samples=0, table=0, width=0):
        import cupy as xp
        if window != SORT_THREADS:
            raise ValueError(f"the device's windows are of {SORT_THREADS} rows (a block's threads), not {window}")
        self.xp, self.indptr, n = xp, indptr, int(indptr.size) - 1
        self.n, self.short, self.longs, self.long_row, self.width = n, short, n - short, long_row, width
        longs = self.longs
        sizes_items = -(-short // (SLICE // 8)) + 2 * longs  # the most: slices at 8 lanes a row, the long rows
        self.launches = {}
        for sampling, shared in ((True, 4 * table), (False, 4 * window)):
            launch, capacity = cooperative_kernel("sell_layout", "sell_build", shared_mem=shared, **LAYOUT_PROGRAM)
            self.launches[sampling] = (launch, max(1, min(capacity, -(-n // SORT_THREADS))))
        grid = max(g for _, g in self.launches.values())
        ints = xp.empty(5 * n + radix_sort_size(n) + radix_sort_size(longs) + longs + sizes_items + 3, dtype=xp.int32)
        (self.length_key, self.rank, self.key, self.ordered, self.places, self._sort_buffers, self._long_buffers,
         self._long_key, self._offsets) = carve(ints, (n, n, n, n, n, radix_sort_size(n), radix_sort_size(longs),
                                                        longs, sizes_items + 3))
        wide = xp.empty(grid + 2 * sizes_items + 3, dtype=xp.int64)
        block_sums, self._counts, self._scan, self.totals = carve(wide, (grid, sizes_items, sizes_items, 3))
        zeroed = xp.zeros(2 + samples * 2, dtype=xp.uint64)
        self._counters, self.sample_counts = {True: zeroed[:1], False: zeroed[1:2]}, zeroed[2:].view(xp.uint32)
        neighbour_sort, self.grouped = radix_sort_fields(self.key, n + 1, xp, buffers=self._sort_buffers)
        self.fields = dict(
            rows=ROWS.pack(n=n, long_row=long_row, indptr=indptr, key=self.length_key, rank=self.rank),
            key=KEY.pack(n=n, long_row=long_row, indptr=indptr, indices=indices, rank=self.rank, key=self.key),
            neighbour_sort=RADIX_SORT.pack(**neighbour_sort),
            sample=SAMPLE.pack(n=n, rows=short, window=window, samples=samples, table=table, itemsize=8,
                               long_row=long_row, indptr=indptr, indices=indices, grouped=self.grouped,
                               counts=self.sample_counts),
            ranks=RANKS.pack(n=n, rows=short, order=self.grouped, rank=self.rank),
            window=WINDOW.pack(n=n, rows=short, window=window, indptr=indptr, order=self.grouped,
                               sorted=self.ordered),
            block_sums=block_sums)

    def run(self, phases, sampling=False):
        """One cooperative launch of ``phases`` (``(name, argument)`` pairs, :data:`PHASES`); ``sampling``: with
        the sample's shared memory (fewer blocks fit)."""
        if len(phases) > MAX_PHASES:
            raise ValueError(f"{len(phases)} phases, more than sell_build takes ({MAX_PHASES})")
        launch, grid = self.launches[sampling]
        padding = [0] * (MAX_PHASES - len(phases))
        launch(grid, (BUILD.pack(**self.fields, counter=self._counters[sampling], count=len(phases),
                                 phases=[PHASES[p] for p, _ in phases] + padding,
                                 args=[a for _, a in phases] + padding),))

    @staticmethod
    def neighbour_passes(passes, first=True):
        """The phases of ``passes`` passes of the neighbours' order after the "rows" phase (the result in
        :attr:`grouped`); without the first pass's where ``first`` is False (it ran in an earlier launch)."""
        one = [("key", 0), ("sort", SORTS["neighbours"])]
        return (one if first else []) + ([("ranks", 0)] + one) * (passes - 1)

    def sort_by_length(self):
        """:meth:`sorted_by` the rows' length keys (:func:`row_keys`)."""
        return self.sorted_by(self.length_key, self.long_row + 1)

    def sorted_by(self, keys, bound):
        """Phases sorting the rows by ``keys`` (n ints from 0 to ``bound``), ties in their order, and the view
        that will hold the order (the neighbours' sort's buffers, free once that order is not taken)."""
        fields, order = radix_sort_fields(keys, bound, self.xp, buffers=self._sort_buffers)
        self.fields["length_sort"] = RADIX_SORT.pack(**fields)
        return [("sort", SORTS["length"])], order

    def longest_first(self, order):
        """Phases putting ``order``'s long rows (from :attr:`short` on) longest first, ties in their order."""
        if self.longs < 2:
            return []
        fields, long_sorted = radix_sort_fields(self._long_key, self.width, self.xp, values=order[self.short:],
                                                buffers=self._long_buffers)
        self.fields["long_sort"] = RADIX_SORT.pack(**fields)
        self.fields["longs"] = LONGS.pack(rows=self.short, longs=self.longs, width=self.width, indptr=self.indptr,
                                          order=order, key=self._long_key, sorted=long_sorted)
        return [("long_keys", 0), ("sort", SORTS["long"]), ("long_rows", 0)]

    def numbered_by(self, order):
        """Phases writing the place of every row in ``order`` into :attr:`places`."""
        self.fields["places"] = RANKS.pack(n=self.n, rows=self.n, order=order, rank=self.places)
        return [("ranks", 1)]

    def sizes(self, order, lanes, slices, piece_length):
        """Phases of the layout's sizes for ``order`` in ``slices`` slices at ``lanes`` a row, and
        ``(slice_ptr, long_start, row_pieces)``, which they fill (:attr:`totals` the three totals)."""
        longs = self.longs
        items = slices + 2 * longs
        slice_ptr, long_start, row_pieces = carve(self._offsets, (slices + 1, longs + 1, longs + 1))
        self.fields["sizes"] = SIZES.pack(rows=self.short, lanes=lanes, slices=slices, longs=longs,
                                          piece_length=piece_length, indptr=self.indptr, order=order,
                                          counts=self._counts[:items], scan=self._scan[:items], slice_ptr=slice_ptr,
                                          long_start=long_start, row_pieces=row_pieces, totals=self.totals)
        return [("counts", 0), ("scan_sums", 0), ("scan", 0), ("offsets", 0)], (slice_ptr, long_start, row_pieces)


class SELL(MatrixFormat):
    """Rows sorted by length, stored in slices of one warp; long rows split into pieces.

    A slice holds ``32 / lanes`` rows, ``lanes`` threads a row: entry k of the
    row at position j of slice s sits at ``slice_ptr[s] + 32 (k // lanes) +
    j lanes + k % lanes`` (column-major within the slice), so a warp's loads are
    coalesced; sorting makes the rows of a slice nearly equally long, so the
    padding (value 0) stays small. More lanes a row shorten each thread's chain
    of dependent loads (small systems, where there are few rows a thread); one
    lane a row wastes no lanes on short rows.

    With ``row_order="length"`` all short rows are sorted by length together,
    longest first, ties in the given order (sigma = n in Kreutzer et al.'s
    terms): the least padding, and slices of nearly equal work follow each other,
    so the product's warps, which take the slices in turn, get nearly equal
    shares (H200, PCG on a power-law graph of 1M rows: windows of 4096 rows, their
    slices dealt out to the warps, 116.2 us an iteration; of 65536 rows 96.6 us;
    all rows together 96.0 us; MEASUREMENTS.md).

    With ``row_order="neighbours"`` the short rows are first put in an order that
    keeps neighbours together (:meth:`_neighbour_order`) and sorted by length
    only within windows of :attr:`NEIGHBOUR_WINDOW` rows: the rows a block of
    the product works on at once then share many of the columns they gather,
    which the SM's L1 cache serves once, although the vectors keep the caller's
    numbering. ``"auto"`` takes the neighbours' order where its windows read at
    most :attr:`NEIGHBOUR_GAIN` times the 32-byte sectors that windows of the
    given order read (:func:`~.base.window_sectors`, on :attr:`SAMPLE_WINDOWS`
    windows, after the order's first pass; the long rows' entries left out): a graph with locality but numbered
    at random, not one already numbered well or one without locality (a
    power-law graph), which keep ``"length"``. A matrix with more columns than
    rows keeps ``"length"``.

    Rows longer than :attr:`LONG_ROW` entries are kept apart, longest first, in
    CSR order after the slices, and cut into pieces of at most :attr:`PIECE_LENGTH` entries, a
    warp a piece: a row far longer than the rest (a graph's hub) is shared by
    many warps instead of holding one back; the pieces' sums are added in a fixed
    order.

    With ``renumber=True`` a layout by neighbours also numbers the rows (and so
    the columns and the vectors) by their place in it: the slices then write runs
    of consecutive rows and gather columns numbered near their own, where as
    numbered both are scattered. So does a
    layout by length that ``"auto"`` chose over a given order whose sample reads
    more than :attr:`SCATTERED` sectors a nonzero (a power-law graph numbered at
    random: rows of equal length together, the hubs' columns first), not one
    numbered well, whose locality the sort by length would scatter.
    :attr:`numbering` is the order (row ``i`` of the layout's numbering is row
    ``numbering[i]`` of the given one), :attr:`places` its inverse; the solver
    carries its vectors across. H200, PCG us an iteration, as numbered and
    renumbered: random geometric graph of 2M rows 280.8 and 199.9, power-law graph
    of 1M rows 87.2 and 80.1 (classic;
    scripts/results/probe_numbered_2026-12-01_0326_NVIDIA_H200_d8b1ffe.md).

    On the device the order and the sizes are one or two cooperative launches of
    the build's phases (:class:`LayoutBuild`: stable radix sorts, the sample, a
    scan), then three kernels place the entries, with two or three reads back to
    the host (the pattern's sizes, auto's sample, the layout's sizes); the NumPy
    path computes the same arrays and is the kernels' reference.
    """

    name = "sell"
    fields = (("n", "int"), ("slices", "int"), ("pieces", "int"), ("slice_ptr", "const int*"),
              ("slice_rows", "const int*"), ("col", "const int*"), ("val", "const real_t*"),
              ("piece_ptr", "const int*"), ("piece_row", "const int*"), ("long_rows", "const int*"),
              ("row_pieces", "const int*"), ("piece_sums", "real_t*"), ("tickets", "unsigned int*"))
    NEIGHBOUR_WINDOW = 256
    LONG_ROW = 64
    PIECE_LENGTH = 512
    NEIGHBOUR_GAIN = 0.6
    # Passes of _neighbour_order. Random geometric graph, 256 rows: 0.92 -> 0.36 -> 0.26 distinct 32-byte
    # sectors of gathered columns a nonzero after one and two passes. H200, PCG (classic) with the rows
    # numbered as laid out after 2 / 3 / 4 passes, us an iteration and the conversion's ms: 2M rows
    # 199.9 / 197.1 / 196.3 us, 3.75 / 4.21 / 4.59 ms; 50k rows 10.7 / 10.7 / 10.4 us, 0.95 / 1.05 / 1.19 ms
    # (scripts/results/probe_numbered_2026-12-01_0326_NVIDIA_H200_d8b1ffe.md): more passes gain less than
    # they cost a set-up within 20 iterations.
    NEIGHBOUR_PASSES = 2
    SCATTERED = 0.4  # sectors a nonzero of the given order's sample above which rows by length are renumbered too
    # Lanes a row at most where the layout numbers the rows: a warp then covers more consecutive rows, whose
    # gathers share sectors. H200, PCG us an iteration with 1 / 2 / 4 lanes (classic, 1024 threads a block):
    # random geometric graph 2M rows 169.0 / 170.3 / 199.5, power-law graph 1M rows 82.4 / 79.1 / 87.3; 50k
    # rows (single-reduction, 512 threads) 12.0 / 8.1 / 8.1 (scripts/probe_formats.py --sweep, MEASUREMENTS.md).
    NUMBERED_LANES = 2
    SAMPLE_WINDOWS = 64
    SAMPLE_TABLE = 2 ** 14  # hash slots of the sample kernel: at least NEIGHBOUR_WINDOW * LONG_ROW keys fit

    @staticmethod
    def auto_lanes(nnz, n):
        """Lanes a row for a mean row length: about a quarter of it, a power of two from 1 to 8.

        H200, PCG per iteration with 1 / 2 / 4 lanes: random geometric graph (15 entries a
        row) 2M rows 325 / 347 / 310 us, 50k rows 12.6 / 14.1 / 12.2 us (single-reduction;
        scripts/probe_formats.py --sweep); power-law graph (7.7 a row) 1M rows, rows by length
        all sorted together, 102.9 / 96.0 / 104.5 us (classic; --sell).
        """
        mean = nnz / max(n, 1)
        return int(min(8, max(1, 2 ** round(np.log2(max(mean / 4, 1.0))))))

    def __init__(self, indptr, indices, xp, lanes=None, row_order="length", stats=None, renumber=False):
        """``stats``: the pattern's :class:`~.base.Pattern` where known (long rows counted for
        :attr:`LONG_ROW`, its columns counted unless ``row_order`` is ``"length"``); ``renumber``: number
        the rows by their place in the layout where it pays (:attr:`numbering`)."""
        stats = stats or pattern_stats(indptr, indices, xp, self.LONG_ROW, columns=row_order != "length")
        super().__init__(indptr, xp, stats.nnz)
        if lanes is not None and lanes not in (1, 2, 4, 8):
            raise InputError(f"SELL lanes a row must be 1, 2, 4 or 8, not {lanes}")
        if row_order not in ROW_ORDERS:
            raise InputError(f"SELL row order must be one of {', '.join(ROW_ORDERS)}, not {row_order!r}")
        self.sectors = None
        self.short = self.n - stats.longs
        by_neighbours = row_order != "length" and self.nnz > 0
        if by_neighbours and stats.columns > self.n:
            if row_order == "neighbours":
                raise InputError("SELL rows by neighbours need a square matrix (columns numbered as rows)")
            by_neighbours = False  # auto: a rectangular matrix's columns are not its rows
        self.numbering = self.places = None
        if xp is np:
            order = self._order(indptr, indices, row_order, by_neighbours, stats.width, renumber, lanes)
            sizes = self._offsets(indptr, order)
        else:
            order, sizes = self._build(indptr, indices, row_order, by_neighbours, stats.width, renumber, lanes)
        self.defines = (("SELL_LANES", str(self.lanes)),)
        self._lay_out(indptr, indices, order, sizes)

    def _settle(self, by_neighbours, renumber, lanes):
        """Once the row order is chosen: its name and sigma, the lanes a row and the slices; True where the
        rows are to be numbered as laid out."""
        self.row_order = "neighbours" if by_neighbours else "length"
        self.sigma = self.NEIGHBOUR_WINDOW if by_neighbours else max(self.short, 1)
        numbered = renumber and (by_neighbours or self.sectors is not None and self.sectors[0] > self.SCATTERED)
        if lanes is None:
            lanes = self.auto_lanes(self.nnz, self.n)
            if numbered:
                lanes = min(lanes, self.NUMBERED_LANES)
        self.lanes = lanes
        self.slices = -(-self.short // (SLICE // lanes))
        return numbered

    def _order(self, indptr, indices, row_order, by_neighbours, width, renumber, lanes):
        """The rows in the layout's order (short rows first), on the host: the reference of :meth:`_build`."""
        length_key, rank = row_keys(indptr, self.LONG_ROW)
        order = self._neighbour_order(indptr, indices, rank, row_order) if by_neighbours else None
        numbered = self._settle(order is not None, renumber, lanes)
        if order is None:
            order = stable_argsort(length_key)
        order = self._longest_first(indptr, order, width)
        if numbered:
            self.numbering, self.places = order, order_ranks(order, self.n)
        return order

    def _build(self, indptr, indices, row_order, by_neighbours, width, renumber, lanes):
        """``(order, sizes)`` on the device: :meth:`_order` and :meth:`_offsets` as phases of a
        :class:`LayoutBuild` (the same steps, and the same arrays, as the NumPy path), in one launch, or in two
        where ``"auto"`` reads the sample's counts back between them to choose the row order; the sizes'
        totals are read back after it."""
        build = LayoutBuild(indptr, indices, self.short, self.LONG_ROW, self.NEIGHBOUR_WINDOW, self.SAMPLE_WINDOWS,
                            self.SAMPLE_TABLE, width)
        phases = [("rows", 0)] + (build.neighbour_passes(1) if by_neighbours else [])
        if by_neighbours and row_order == "auto":
            build.run(phases + [("sample", 0)], sampling=True)
            phases, self.sectors = [], self._sector_ratios(build.sample_counts)
            by_neighbours = self.sectors[1] <= self.NEIGHBOUR_GAIN * self.sectors[0]
        numbered = self._settle(by_neighbours, renumber, lanes)
        if by_neighbours:
            # the first pass is in `phases` already, or ran with the sample
            phases += build.neighbour_passes(self.NEIGHBOUR_PASSES, first=False) + [("window", 0)]
            order = build.ordered
        else:
            by_length, order = build.sort_by_length()
            phases += by_length
        phases += build.longest_first(order)
        if numbered:
            phases += build.numbered_by(order)
            self.numbering, self.places = order, build.places
        sizes, offsets_ = build.sizes(order, self.lanes, self.slices, self.PIECE_LENGTH)
        build.run(phases + sizes)
        return order, offsets_ + (tuple(int(v) for v in host(build.totals)),)

    # -- row order ------------------------------------------------------------
    def _neighbour_order(self, indptr, indices, rank, row_order):
        """Every row by position in the layout (short rows first), or None where ``"auto"`` does not take the
        neighbours' order.

        Each pass sorts the rows by the least rank of their columns (ties by row),
        the ranks being the column numbers at first, then the previous pass's
        positions: rows sharing a neighbour become adjacent, and a second pass
        draws the groups of adjacent rows together. Long rows' columns take no
        part (a hub is everyone's neighbour), and the long rows come last. With
        ``"auto"`` the first pass's windows are compared with the given order's
        (on a sample) before the second pass is made. Then the short rows are
        sorted by length, longest first, within windows of
        :attr:`NEIGHBOUR_WINDOW` rows.
        """
        for done in range(self.NEIGHBOUR_PASSES):
            order = neighbour_pass(indptr, indices, rank, self.LONG_ROW)
            if done == 0 and row_order == "auto":
                self.sectors = self._sample_sectors(indptr, indices, order)
                if self.sectors[1] > self.NEIGHBOUR_GAIN * self.sectors[0]:
                    return None
            if done + 1 < self.NEIGHBOUR_PASSES:
                rank = order_ranks(order, self.short)
        return window_sort(indptr, order, self.short, self.NEIGHBOUR_WINDOW, self.LONG_ROW)

    def _sample_sectors(self, indptr, indices, grouped):
        """Sectors a nonzero that :attr:`SAMPLE_WINDOWS` windows of :attr:`NEIGHBOUR_WINDOW` rows read: in the
        given order (rows as numbered, the long rows' entries left out) and in ``grouped`` (its first
        ``self.short`` rows, the short ones), by :func:`~.base.window_sectors` (the NumPy meaning of the
        build's "sample" phase: a block a sampled window, its distinct sectors in a hash table in shared
        memory)."""
        n, ns, window, top = self.n, self.short, self.NEIGHBOUR_WINDOW, self.LONG_ROW
        lengths = np.diff(indptr)
        keep = lengths <= top
        short_ptr = offsets(np.where(keep, lengths, 0))
        short_indices = indices[np.repeat(keep, lengths)]
        return (window_sectors(short_ptr, short_indices, np.arange(n), window, np, samples=self.SAMPLE_WINDOWS),
                window_sectors(indptr, indices, grouped[:ns], window, np, samples=self.SAMPLE_WINDOWS))

    def _sector_ratios(self, counts):
        """The two orders' sectors a nonzero from the sample phase's counts (read back)."""
        totals = host(counts).reshape(2, self.SAMPLE_WINDOWS, 2).astype(np.int64).sum(axis=1)
        return tuple(float(d / e) if e else 0.0 for d, e in totals)

    def _longest_first(self, indptr, order, width):
        """``order`` with its long rows (after the short ones) sorted by length, longest first, ties in their
        order (``width``: the longest row): the kernels deal the pieces out from the last warp down, the
        largest first (``WorkItems``; NumPy: the meaning of the build's long_keys, sort and long_rows
        phases)."""
        ns = self.short
        if self.n - ns > 1:  # in place: ``order`` is the layout's own
            long_rows = order[ns:]
            order[ns:] = long_rows[np.argsort(width - np.diff(indptr)[long_rows], kind="stable")]
        return order

    # -- layout ---------------------------------------------------------------
    def _lay_out(self, indptr, indices, order, sizes):
        """The slices and pieces of the rows in ``order`` (short rows first) from their ``sizes``
        (:meth:`_offsets`), and every entry's place; with :attr:`places`, the rows and columns numbered by
        them.

        The arrays the layout keeps are carved from one allocation (:meth:`_held`); the order and the sizes,
        which live in the build's buffers on the device, are copied in, so that those buffers are freed with
        the build."""
        xp, n, ns = self.xp, self.n, self.short
        slice_ptr, long_start, row_pieces, (sliced, long_entries, self.pieces) = sizes
        self.size = sliced + long_entries
        if self.size >= 2**31 - 1:
            raise InputError("the SELL layout needs 2^31 or more entries (int32 offsets): "
                             "use the csr matrix format")
        self.padding = (sliced - (self.nnz - long_entries)) / max(self.nnz, 1)
        numbered = n if self.places is not None else 0
        held = self._held(col=self.size, src=self.size, slice_rows=self.slices * SLICE, slice_ptr=self.slices + 1,
                          row_pieces=n - ns + 1, long_rows=n - ns, piece_ptr=self.pieces + 1, piece_row=self.pieces,
                          tickets=max(n - ns, 1), numbering=numbered, places=numbered)
        for name, value in (("slice_ptr", slice_ptr), ("row_pieces", row_pieces), ("long_rows", order[ns:]),
                            ("numbering", self.numbering), ("places", self.places)):
            if value is not None:
                copy_into(held[name], value)
                setattr(self, name, held[name])
        self.piece_ptr, self.piece_row = held["piece_ptr"], held["piece_row"]
        self._cut_pieces(long_start, sliced)
        self._src, self.col, self.slice_rows = held["src"], held["col"], held["slice_rows"]
        self._place_entries(indptr, indices, order, long_start, sliced)
        if self.places is not None:  # the long rows come last: numbered from the short rows' count on
            self.long_rows[...] = xp.arange(ns, n, dtype=xp.int32)
        self.tickets = held["tickets"].view(xp.uint32)
        self.tickets.fill(0)
        self._piece_sums = {}

    def _held(self, **sizes):
        """Views of one int32 allocation, one of each of ``sizes`` by name: a fresh device allocation costs
        0.06-0.09 ms however large (H200, MEASUREMENTS.md), so the layout takes one, not one an array."""
        return dict(zip(sizes, carve(self.xp.empty(sum(sizes.values()), dtype=self.xp.int32), sizes.values())))

    def _offsets(self, indptr, order):
        """``(slice_ptr, long_start, row_pieces, (sliced, long_entries, pieces))``: where each slice starts (and
        one past the last: 32 slots for each ``lanes`` entries of its first, longest row), where each long row
        starts after the slices and where its pieces start among the pieces, and the three totals (NumPy: the
        meaning of the build's counts, scan and offsets phases)."""
        ns, lanes, piece = self.short, self.lanes, self.PIECE_LENGTH
        lengths = np.diff(indptr)
        slice_ptr = offsets((lengths[order[:ns:SLICE // lanes]] + lanes - 1) // lanes * SLICE)
        long_start = offsets(lengths[order[ns:]])
        row_pieces = offsets((lengths[order[ns:]] + piece - 1) // piece)
        totals = (int(slice_ptr[-1]), int(long_start[-1]), int(row_pieces[-1]))
        return slice_ptr.astype(np.int32), long_start.astype(np.int32), row_pieces.astype(np.int32), totals

    def _cut_pieces(self, long_start, sliced):
        """Fill :attr:`piece_ptr` and :attr:`piece_row`: where each piece of the long rows starts (and one past the
        last), and which long row it belongs to (``sell_cut_pieces`` on the device)."""
        xp, longs, pieces, row_pieces = self.xp, int(long_start.size) - 1, self.pieces, self.row_pieces
        if xp is np:
            piece_row = entry_rows(row_pieces, np)  # pieces are the "entries" of the long rows
            within = np.arange(pieces, dtype=np.int32) - row_pieces[piece_row]
            self.piece_ptr[...] = np.append(sliced + long_start[piece_row] + within * self.PIECE_LENGTH,
                                            sliced + long_start[-1])
            self.piece_row[...] = piece_row
            return
        launch("sell_cut_pieces", pieces + 1, PIECES, longs=longs, pieces=pieces, sliced=sliced,
               piece_length=self.PIECE_LENGTH, long_start=long_start, row_pieces=row_pieces, piece_ptr=self.piece_ptr,
               piece_row=self.piece_row)

    def _place_entries(self, indptr, indices, order, long_start, sliced):
        """Fill ``_src``, :attr:`col` and :attr:`slice_rows`: the CSR entry in every slot of the layout (-1 for
        padding), the columns, and the row of every lane of the slices (-1 for none); with :attr:`places`, rows
        and columns as numbered by them (a short row's number its position).

        The NumPy meaning of ``sell_place`` (a warp a slice)
        and ``sell_place_long`` (a thread an entry of the long rows), which the
        CuPy path runs. Entry e of row r, k = e - indptr[r] its place in the row,
        goes to base[r] + 32 (k // lanes) + k % lanes = base[r] + k + (32 - lanes)
        (k // lanes) in a slice, base[r] + k (CSR order) after the slices for a
        long row.
        """
        xp, lanes, rows_per_slice, ns = self.xp, self.lanes, SLICE // self.lanes, self.short
        if xp is not np:
            max_steps = -(-self.LONG_ROW // lanes)  # a slice's first row is its longest, and short
            fields = dict(lanes=lanes, rows=ns, positions=self.slices * rows_per_slice, sliced=sliced, indptr=indptr,
                          indices=indices, order=order, slice_ptr=self.slice_ptr, long_start=long_start,
                          long_rows=self.long_rows, longs=int(self.long_rows.size), places=self.places,
                          max_steps=max_steps, col=self.col, src=self._src, slice_rows=self.slice_rows)
            if self.long_rows.size:
                launch("sell_place_long", self.size - sliced, LAYOUT, **fields)
            if self.slices:  # a warp a slice, PLACE_WARPS a block
                layout_kernel("sell_place")((min(-(-self.slices // PLACE_WARPS), 4096),), (32 * PLACE_WARPS,),
                                            (LAYOUT.pack(**fields),),
                                            shared_mem=4 * PLACE_WARPS * (3 * SLICE + SLICE * max_steps))
            return
        slot_rows = np.full(self.slices * rows_per_slice, -1, dtype=np.int32)
        slot_rows[:ns] = order[:ns] if self.places is None else np.arange(ns)
        slice_rows = self.slice_rows
        slice_rows[...] = np.repeat(slot_rows, lanes)  # the row of every lane
        slot = np.empty(self.n, dtype=np.int32)
        slot[order] = np.arange(self.n, dtype=np.int32)
        is_long = slot >= ns
        place = np.where(is_long, 0, slot)
        slice_ptr = self.slice_ptr
        base = slice_ptr[place // rows_per_slice] + (place % rows_per_slice) * lanes
        base[self.long_rows] = sliced + long_start[:-1]
        spread = np.where(is_long, 0, SLICE - lanes).astype(np.int32)
        row_of = entry_rows(indptr, np)
        k = np.arange(self.nnz, dtype=np.int32) - indptr[row_of]
        pos = (base - indptr[:-1]).astype(np.int32)[row_of] + np.arange(self.nnz, dtype=np.int32)
        pos += spread[row_of] * (k // lanes)
        # padding points at its lane's own row (0 for lanes without one): it gathers nothing new
        slice_of = entry_rows(slice_ptr, np)  # positions are the "entries" of the slices
        pad_col = np.maximum(slice_rows[slice_of.astype(np.int64) * SLICE + np.arange(sliced) % SLICE], 0)
        col, src = self.col, self._src
        col[...] = 0
        col[:sliced] = pad_col
        col[pos] = indices if self.places is None else self.places[indices]
        src[...] = -1
        src[pos] = np.arange(self.nnz, dtype=np.int32)

    @property
    def piece_sums(self):
        """Scratch for the pieces' sums, of the values' type (set by :meth:`pack`)."""
        return self._piece_sums[self._dtype]

    def pack(self, val):
        self._dtype = np.dtype(val.dtype)
        if self._dtype not in self._piece_sums:
            self._piece_sums[self._dtype] = self.xp.zeros(max(self.pieces, 1), dtype=self._dtype)
        return super().pack(val)

    def threads(self):
        return SLICE * (self.slices + -(-self.pieces // SLICE) * SLICE)  # slices start at a multiple of 32

    def stage_steps(self, warps):
        """Each warp stages its slices, a header step and the slice's steps each; the slices are dealt to
        warps as ``WorkItems`` in ``kernels/sell.cu`` deals them: in rounds, from the first warp up in even
        rounds, from the last down in odd ones (the pieces are not staged)."""
        xp, slices = self.xp, self.slices
        if slices == 0:
            return 0
        steps = (xp.diff(self.slice_ptr) // SLICE + 1).astype(xp.int64)
        s = xp.arange(slices)
        position = s % warps
        warp = xp.where((s // warps) % 2 == 1, warps - 1 - position, position)
        return int(xp.bincount(warp, weights=steps, minlength=warps).max())

    def describe(self):
        text = f"sell (C={SLICE // self.lanes}, {self.lanes} lanes a row, rows by {self.row_order}"
        if self.sectors:
            text += f" ({self.sectors[0]:.2f} sectors a nonzero given, {self.sectors[1]:.2f} by neighbours)"
        text += f", sigma={'all rows' if self.row_order == 'length' else self.sigma}, {self.padding:.1%} padding"
        if self.numbering is not None:
            text += ", rows numbered as laid out"
        if self.pieces:
            text += f"; {int(self.long_rows.size)} rows over {self.LONG_ROW} entries in {self.pieces} pieces"
        return text + ")"

    def product(self, val, v):
        val, col = host(val), host(self.col)
        slice_ptr, slot_rows = host(self.slice_ptr).astype(np.int64), host(self.slice_rows)
        out = np.zeros(self.n, dtype=np.result_type(val, v))
        position = np.arange(int(slice_ptr[-1]))
        in_slice = np.searchsorted(slice_ptr, position, side="right") - 1
        rows = slot_rows[in_slice * SLICE + (position - slice_ptr[in_slice]) % SLICE]  # the lane's row
        keep = rows >= 0
        np.add.at(out, rows[keep], val[position[keep]] * v[col[position[keep]]])
        piece_ptr, piece_row, long_rows = host(self.piece_ptr), host(self.piece_row), host(self.long_rows)
        for pc in range(self.pieces):
            span = slice(int(piece_ptr[pc]), int(piece_ptr[pc + 1]))
            out[long_rows[piece_row[pc]]] += val[span] @ v[col[span]]
        return out
