"""SELL-C-sigma with long rows split into pieces (``kernels/sell.cu``)."""
import numpy as np

from ..errors import InputError
from ..kernels.structs import Struct
from .base import MatrixFormat, entry_rows, host, window_sectors

SLICE = 32  # rows a slice: one warp, a thread a row
# The layout kernel's argument (kernels/sell_layout.cu).
LAYOUT = Struct("SellLayout", [("n", "int"), ("lanes", "int"), ("sliced", "int"), ("indptr", "const int*"),
                               ("indices", "const int*"), ("slot", "const int*"), ("slice_ptr", "const int*"),
                               ("long_start", "const int*"), ("long_rows", "const int*"), ("longs", "int"),
                               ("col", "int*"), ("pos", "int*")])
# The neighbour key kernel's argument (kernels/sell_layout.cu).
KEY = Struct("SellKey", [("n", "int"), ("long_row", "int"), ("indptr", "const int*"), ("indices", "const int*"),
                         ("rank", "const int*"), ("key", "int*")])
LAYOUT_STRUCTS = (LAYOUT, KEY)
ROW_ORDERS = ("auto", "neighbours", "length")


def layout_kernel(name):
    """A kernel of ``kernels/sell_layout.cu`` (compiled once a process)."""
    from .. import kernels
    return kernels.module("sell_layout", structs=LAYOUT_STRUCTS).get_function(name)


class SELL(MatrixFormat):
    """Rows sorted by length within windows of ``sigma`` rows, stored in slices of one warp.

    A slice holds ``32 / lanes`` rows, ``lanes`` threads a row: entry k of the
    row at position j of slice s sits at ``slice_ptr[s] + 32 (k // lanes) +
    j lanes + k % lanes`` (column-major within the slice), so a warp's loads are
    coalesced; sorting makes the rows of a slice nearly equally long, so the
    padding (value 0) stays small. ``sigma`` is the smallest window in
    :attr:`SIGMAS` that keeps the padding at most :attr:`MAX_PADDING` (small
    windows keep the results each warp writes close together). More lanes a row
    shorten each thread's chain of dependent loads (small systems, where there
    are few rows a thread); one lane a row wastes no lanes on short rows.

    With ``row_order="neighbours"`` the short rows are first put in an order that
    keeps neighbours together (:meth:`_neighbour_order`) and the windows are the
    smallest, :attr:`SIGMAS` [0] rows: the rows a block of the product works on at
    once then share many of the columns they gather, which the SM's L1 cache
    serves once, although the vectors keep the caller's numbering. With
    ``"length"`` windows follow the given order. ``"auto"`` takes the neighbours'
    order where its windows read at most :attr:`NEIGHBOUR_GAIN` times the 32-byte
    sectors that windows of the given order read (:func:`~.base.window_sectors`,
    on a sample): a graph with locality but numbered at random, not one already
    numbered well or one without locality (a power-law graph). A matrix with more
    columns than rows keeps ``"length"``.

    Rows longer than :attr:`LONG_ROW` entries are kept apart, in CSR order after
    the slices, and cut into pieces of at most :attr:`PIECE_LENGTH` entries, a
    warp a piece: a row far longer than the rest (a graph's hub) is shared by
    many warps instead of holding one back; the pieces' sums are added in a fixed
    order.
    """

    name = "sell"
    fields = (("n", "int"), ("slices", "int"), ("pieces", "int"), ("slice_ptr", "const int*"),
              ("slice_rows", "const int*"), ("col", "const int*"), ("val", "const real_t*"),
              ("piece_ptr", "const int*"), ("piece_row", "const int*"), ("long_rows", "const int*"),
              ("row_pieces", "const int*"), ("piece_sums", "real_t*"), ("tickets", "unsigned int*"))
    SIGMAS = (256, 1024, 4096, 16384, 65536)  # each a multiple of the first (_slots_per_window)
    MAX_PADDING = 0.05
    LONG_ROW = 64
    PIECE_LENGTH = 512
    NEIGHBOUR_GAIN = 0.6
    NEIGHBOUR_PASSES = 2  # passes of _neighbour_order (random geometric graph, 256 rows: 0.92 -> 0.36 -> 0.26
    #                       distinct 32-byte sectors of gathered columns a nonzero after one and two passes)

    @staticmethod
    def auto_lanes(nnz, n):
        """Lanes a row for a mean row length: about a quarter of it, a power of two from 1 to 8.

        H200, PCG per iteration with 1 / 2 / 4 lanes: random geometric graph (15 entries a
        row) 2M rows 325 / 347 / 310 us, 50k rows 12.6 / 14.1 / 12.2 us (single-reduction);
        power-law graph (7.7 a row) 1M rows 158 / 97 / 98 us (scripts/probe_formats.py --sweep).
        """
        mean = nnz / max(n, 1)
        return int(min(8, max(1, 2 ** round(np.log2(max(mean / 4, 1.0))))))

    def __init__(self, indptr, indices, xp, lanes=None, row_order="length"):
        super().__init__(indptr, xp)
        if lanes is None:
            lanes = self.auto_lanes(self.nnz, self.n)
        if lanes not in (1, 2, 4, 8):
            raise InputError(f"SELL lanes a row must be 1, 2, 4 or 8, not {lanes}")
        if row_order not in ROW_ORDERS:
            raise InputError(f"SELL row order must be one of {', '.join(ROW_ORDERS)}, not {row_order!r}")
        self.lanes, self.sectors = lanes, None
        self.defines = (("SELL_LANES", str(lanes)),)
        rows_per_slice = SLICE // lanes
        n = self.n
        i32 = lambda a: xp.ascontiguousarray(a, dtype=xp.int32)  # noqa: E731
        lengths = xp.diff(indptr).astype(xp.int64)
        is_long = lengths > self.LONG_ROW
        short_rows = xp.nonzero(~is_long)[0]
        long_rows = xp.nonzero(is_long)[0]
        if row_order != "length" and self.nnz and int(indices.max()) >= n:
            if row_order == "neighbours":
                raise InputError("SELL rows by neighbours need a square matrix (columns numbered as rows)")
            row_order = "length"  # auto: a rectangular matrix's columns are not its rows
        if row_order != "length":
            grouped = short_rows[self._neighbour_order(indptr, indices, short_rows, is_long)]
            if row_order == "auto":
                self.sectors = tuple(window_sectors(indptr, indices, rows, self.SIGMAS[0], xp, samples=64)
                                     for rows in (short_rows, grouped))
                row_order = "neighbours" if self.sectors[1] <= self.NEIGHBOUR_GAIN * self.sectors[0] else "length"
            if row_order == "neighbours":
                short_rows = grouped
        self.row_order = row_order
        short_len = lengths[short_rows]

        self.sigma = self.SIGMAS[0] if row_order == "neighbours" else self._choose_sigma(short_len)
        order = self._sort_in_windows(short_len, self.sigma)
        sorted_rows = short_rows[order]
        ns = int(sorted_rows.size)
        self.slices = -(-ns // rows_per_slice)
        position_rows = xp.full(self.slices * rows_per_slice, -1, dtype=xp.int64)
        position_rows[:ns] = sorted_rows
        position_rows = position_rows.reshape(self.slices, rows_per_slice)[self._deal_slices()].ravel()
        position_len = xp.where(position_rows >= 0, lengths[xp.maximum(position_rows, 0)], 0)
        longest = (position_len.reshape(self.slices, rows_per_slice).max(axis=1) if self.slices
                   else position_len[:0])
        slice_ptr = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(-(-longest // lanes) * SLICE)])
        sliced = int(slice_ptr[-1])
        slot_rows = xp.repeat(position_rows, lanes) if lanes > 1 else position_rows  # the row of every lane

        long_len = lengths[long_rows]
        long_start = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(long_len)])
        pieces_of = -(-long_len // self.PIECE_LENGTH)
        row_pieces = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(pieces_of)])
        self.pieces = int(row_pieces[-1])
        piece_row = entry_rows(row_pieces, xp)  # pieces are the "entries" of the long rows
        within = xp.arange(self.pieces) - row_pieces[piece_row]
        piece_ptr = xp.concatenate([sliced + long_start[piece_row] + within * self.PIECE_LENGTH,
                                    xp.asarray([sliced + int(long_start[-1])], dtype=xp.int64)])
        self.size = sliced + int(long_start[-1])
        if self.size >= 2**31 - 1:
            raise InputError("the SELL layout needs 2^31 or more entries (int32 offsets): "
                             "use the csr matrix format")

        place = xp.zeros(n, dtype=xp.int64)
        placed = xp.nonzero(position_rows >= 0)[0]
        place[position_rows[placed]] = placed
        slice_ptr32 = i32(slice_ptr)
        if xp is np:
            self._pos, self.col = self._place_entries(indptr, indices, place, long_rows, long_start, slice_ptr,
                                                      slot_rows, is_long)
        else:
            self._pos, self.col = self._place_entries_on_device(indptr, indices, place, long_rows, long_start,
                                                                slice_ptr32)
        self.slice_ptr, self.slice_rows = slice_ptr32, i32(slot_rows)
        self.piece_ptr, self.piece_row, self.long_rows = i32(piece_ptr), i32(piece_row), i32(long_rows)
        self.row_pieces = i32(row_pieces)
        self.tickets = xp.zeros(max(int(long_rows.size), 1), dtype=xp.uint32)
        self._piece_sums = {}
        self.padding = (sliced - int(short_len.sum())) / max(self.nnz, 1)

    def _place_entries(self, indptr, indices, place, long_rows, long_start, slice_ptr, slot_rows, is_long):
        """``(pos, col)``: the place of every CSR entry in the layout, and the columns with the padding.

        The NumPy meaning of ``kernels/sell_layout.cu`` (which the CuPy path runs).
        Entry e of row r, k = e - indptr[r] its place in the row, goes to
        base[r] + 32 (k // lanes) + k % lanes = base[r] + k + (32 - lanes) (k // lanes)
        in a slice, base[r] + k (CSR order) after the slices for a long row.
        """
        xp, lanes = self.xp, self.lanes
        rows_per_slice = SLICE // lanes
        sliced = int(slice_ptr[-1])
        base = slice_ptr[place // rows_per_slice] + (place % rows_per_slice) * lanes
        base[long_rows] = sliced + long_start[:-1]
        spread = xp.where(is_long, 0, SLICE - lanes).astype(xp.int32)
        row_of = entry_rows(indptr, xp)
        k = xp.arange(self.nnz, dtype=xp.int32) - indptr[row_of]
        pos = (base - indptr[:-1]).astype(xp.int32)[row_of] + xp.arange(self.nnz, dtype=xp.int32)
        pos += spread[row_of] * (k // lanes)
        # padding points at its lane's own row (0 for lanes without one): it gathers nothing new
        slice_of = entry_rows(slice_ptr.astype(xp.int32), xp)  # positions are the "entries" of the slices
        pad_col = xp.maximum(slot_rows[slice_of.astype(xp.int64) * SLICE + xp.arange(sliced) % SLICE], 0)
        col = xp.zeros(self.size, dtype=xp.int32)
        col[:sliced] = pad_col
        col[pos] = indices
        return pos, col

    def _place_entries_on_device(self, indptr, indices, place, long_rows, long_start, slice_ptr32):
        """:meth:`_place_entries` by one kernel pass over the rows (CuPy arrays)."""
        xp = self.xp
        slot = place.astype(xp.int32)
        slot[long_rows] = -1 - xp.arange(long_rows.size, dtype=xp.int32)
        pos = xp.empty(self.nnz, dtype=xp.int32)
        col = xp.zeros(self.size, dtype=xp.int32)
        args = LAYOUT.pack(n=self.n, lanes=self.lanes, sliced=int(slice_ptr32[-1]), indptr=indptr, indices=indices,
                           slot=slot, slice_ptr=slice_ptr32, long_start=long_start.astype(xp.int32),
                           long_rows=long_rows.astype(xp.int32), longs=int(long_rows.size), col=col, pos=pos)
        if long_rows.size:
            layout_kernel("sell_place_long")((max(1, min(-(-int(long_start[-1]) // 256), 4096)),), (256,), (args,))
        layout_kernel("sell_place")((max(1, min(-(-self.n // 256), 4096)),), (256,), (args,))
        return pos, col

    @classmethod
    def _slots_per_window(cls, short_len, xp, lanes=1):
        """Slots the slices take with each window of :attr:`SIGMAS` (rows sorted by length within a window).

        A slice of R = 32 / lanes rows takes 32 slots for each ``lanes`` entries of
        its longest row. In a window, ceil(c_m / R) slices have a row of at least m
        entries, c_m the rows with at least m entries; so the slots are 32 times the
        sum of ceil(c_m / R) over m = 1, 1 + lanes, 1 + 2 lanes, ... The rows of each
        length are counted once, in windows of the smallest size; a wider window's
        counts are sums of those (every size a multiple of the smallest).

        Returns
        -------
        ndarray of int64 (host), one total a window size
        """
        if short_len.size == 0:
            return np.zeros(len(cls.SIGMAS), dtype=np.int64)
        top, smallest = cls.LONG_ROW + 1, cls.SIGMAS[0]
        window = xp.arange(short_len.size) // smallest
        counts = xp.bincount(window * top + short_len, minlength=int(window[-1] + 1) * top).reshape(-1, top)
        rows_per_slice = SLICE // lanes
        totals = []
        for sigma in cls.SIGMAS:
            group = sigma // smallest
            windows = -(-counts.shape[0] // group)
            grouped = xp.zeros((windows * group, top), dtype=counts.dtype)
            grouped[:counts.shape[0]] = counts
            grouped = grouped.reshape(windows, group, top).sum(axis=1)
            at_least = xp.cumsum(grouped[:, ::-1], axis=1)[:, ::-1]
            totals.append((-(-at_least[:, 1::lanes] // rows_per_slice)).sum())
        return host(SLICE * xp.stack(totals))

    def _choose_sigma(self, short_len):
        """The smallest window whose padding is at most MAX_PADDING, or close to the least possible.

        With several lanes a row, rounding each row up to a multiple of the lanes
        leaves padding no window removes; a window then only has to come within a
        few percent of what the widest one achieves.
        """
        total = int(short_len.sum())
        slots = self._slots_per_window(short_len, self.xp, self.lanes)
        bound = max((1 + self.MAX_PADDING) * total, slots[-1] + self.MAX_PADDING / 2 * total)
        return next(s for s, taken in zip(self.SIGMAS, slots) if taken <= bound)

    def _neighbour_order(self, indptr, indices, short_rows, is_long):
        """Positions into ``short_rows`` in an order that keeps rows with common neighbours together.

        Each pass sorts the rows by the least rank of their columns (ties by row),
        the ranks being the column numbers at first, then the previous pass's
        positions: rows sharing a neighbour become adjacent, and a second pass
        draws the groups of adjacent rows together. Long rows' columns take no
        part (a hub is everyone's neighbour). One pass is a kernel over the
        entries (``sell_neighbour_key``) and a sort of the short rows.
        """
        xp, n = self.xp, self.n
        rank = xp.where(is_long, n, xp.arange(n)).astype(xp.int32)
        order = None
        for _ in range(self.NEIGHBOUR_PASSES):
            key = self._neighbour_key(indptr, indices, rank)
            order = xp.argsort(key[short_rows].astype(xp.int64) * n + short_rows)
            rank = xp.full(n, n, dtype=xp.int32)
            rank[short_rows[order]] = xp.arange(short_rows.size, dtype=xp.int32)
        return order

    def _neighbour_key(self, indptr, indices, rank):
        """Least ``rank`` of each row's columns (``kernels/sell_layout.cu``).

        ``n`` for an empty row and for a row over :attr:`LONG_ROW` entries, which
        takes no part in the order.
        """
        xp, n = self.xp, self.n
        if xp is np:
            values = np.append(rank[indices], np.int32(n))
            least = np.minimum.reduceat(values, indptr[:-1]) if n else values[:0]
            length = np.diff(indptr)
            return np.where((length > 0) & (length <= self.LONG_ROW), least, n).astype(np.int32)
        key = xp.empty(n, dtype=xp.int32)
        layout_kernel("sell_neighbour_key")((max(1, min(-(-n // 256), 4096)),), (256,),
                                            (KEY.pack(n=n, long_row=self.LONG_ROW, indptr=indptr, indices=indices,
                                                      rank=rank, key=key),))
        return key

    def _deal_slices(self):
        """Order of the slices: each window's, longest first, dealt out to its groups of 32 in turn.

        The product hands aligned groups of 32 slices to a block's warps together
        (``kernels/sell.cu``); a group of a window's longest slices would keep its
        block busy while others idle. Dealt out, slice j of a window with G groups
        goes to group j mod G, so every group holds long and short slices alike.
        A window of 32 slices or fewer keeps its order.
        """
        xp = self.xp
        per_window = self.sigma // (SLICE // self.lanes)
        t = xp.arange(self.slices)
        if per_window <= SLICE:
            return t
        window, j = t // per_window, t % per_window
        count = xp.minimum(per_window, self.slices - window * per_window)  # the last window may be short
        groups = -(-count // SLICE)
        return xp.argsort(window * per_window + (j % groups) * SLICE + j // groups)

    def _sort_in_windows(self, short_len, sigma):
        """Order of the short rows: by window, longest first within a window, then by row (unique keys)."""
        xp = self.xp
        ns = short_len.size
        position = xp.arange(ns, dtype=xp.int64)
        key = ((position // sigma) * (self.LONG_ROW + 1) + (self.LONG_ROW - short_len)) * ns + position
        return xp.argsort(key)

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

    def describe(self):
        text = f"sell (C={SLICE // self.lanes}, {self.lanes} lanes a row, rows by {self.row_order}"
        if self.sectors:
            text += f" ({self.sectors[0]:.2f} sectors a nonzero given, {self.sectors[1]:.2f} by neighbours)"
        text += f", sigma={self.sigma}, {self.padding:.1%} padding"
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
