"""What every matrix format provides (see :mod:`solvers.formats`)."""
import functools
from typing import NamedTuple

import numpy as np

from ..kernels.structs import Struct

# The arguments of the shared layout kernels (kernels/layout.cu), one struct each.
PATTERN = Struct("PatternStats", [("n", "int"), ("long_row", "int"), ("columns", "int"), ("indptr", "const int*"),
                                  ("indices", "const int*"), ("stats", "int*")])
ELL_PLACE = Struct("EllPlace", [("n", "int"), ("width", "int"), ("indptr", "const int*"), ("indices", "const int*"),
                                ("col", "int*"), ("src", "int*")])
DIA_PLACE = Struct("DiaPlace", [("n", "int"), ("width", "int"), ("samples", "int"), ("indptr", "const int*"),
                                ("indices", "const int*"), ("diagonals", "const int*"), ("sample", "int*"),
                                ("src", "int*"), ("stats", "int*"), ("rest_ptr", "int*"), ("rest_col", "int*"),
                                ("rest_src", "int*")])
LAYOUT_STRUCTS = (PATTERN, ELL_PLACE, DIA_PLACE)
# The device's stable sort of int keys carrying int values (kernels/sort.cu).
RADIX_SORT = Struct("RadixSort", [("n", "int"), ("tile", "int"), ("tiles", "int"), ("passes", "int"),
                                  ("keys", "const int*"), ("values", "const int*"), ("counts", "int*"),
                                  ("key_buffers", "int*"), ("value_buffers", "int*")])
RADIX_BITS, SORT_THREADS, SORT_TILES = 8, 256, 1024  # a pass's digits; a block's threads; a sort's tiles at most
SORT_DEFINES = (("RADIX_BITS", str(RADIX_BITS)), ("SORT_THREADS", str(SORT_THREADS)),  # for kernels/sort.cu
                ("SORT_TILES", str(SORT_TILES)))


@functools.lru_cache(maxsize=None)
def layout_kernel(file, name, structs=LAYOUT_STRUCTS, before=(), defines=()):
    """Kernel ``name`` of ``kernels/<file>.cu`` (after the files ``before``, with ``structs`` and ``defines``),
    compiled, and the program text made, once a process."""
    from .. import kernels
    return kernels.module(file, structs=structs, before=before, defines=defines).get_function(name)


@functools.lru_cache(maxsize=None)
def cooperative_kernel(file, name, structs, before=(), defines=(), shared_mem=0):
    """``(launch, max_blocks)``: a cooperative launcher of a layout kernel with grid barriers, SORT_THREADS
    threads and ``shared_mem`` bytes of dynamic shared memory a block, and the blocks the GPU holds at once
    with that memory (:func:`solvers.kernels.cooperative`)."""
    from .. import kernels
    kernel = layout_kernel(file, name, structs, before, defines)
    # one function serves launches of every size: its limit only ever rises, so that none is refused
    if kernel.max_dynamic_shared_size_bytes < shared_mem:
        kernel.max_dynamic_shared_size_bytes = shared_mem
    launch, max_blocks = kernels.cooperative(kernel, SORT_THREADS, shared_mem)
    return (lambda grid, args: launch(grid, args, shared_mem=shared_mem)), max_blocks


@functools.lru_cache(maxsize=None)
def _gather_kernel():
    """``out = data[src]``, 0 where ``src`` is -1, as one CuPy elementwise kernel."""
    import cupy
    return cupy.ElementwiseKernel("raw T data, int32 src", "T out", "out = src < 0 ? (T)0 : data[src]",
                                  "gather_values")


def stride_grid(items):
    """Blocks of 256 threads for a grid-stride layout kernel over ``items``."""
    return max(1, min(-(-int(items) // 256), 4096))


def launch(file, name, items, struct, structs=LAYOUT_STRUCTS, **fields):
    """Run the grid-stride layout kernel ``name`` over ``items`` with its struct filled from ``fields``."""
    layout_kernel(file, name, structs)((stride_grid(items),), (256,), (struct.pack(**fields),))


def radix_tiles(n):
    """``(tile, tiles)``: the elements a tile of the device's sort of ``n`` keys (a multiple of SORT_THREADS, so
    that there are at most SORT_TILES of them) and the tiles."""
    tile = -(-max(4 * SORT_THREADS, -(-n // SORT_TILES)) // SORT_THREADS) * SORT_THREADS
    return tile, -(-n // tile)


def radix_sort_size(n):
    """The int32 buffers the device's sort of ``n`` keys takes (two of keys, two of values, the tiles' counts and
    the digits' totals)."""
    return 4 * n + (radix_tiles(n)[1] + 1 << RADIX_BITS)


def carve(array, sizes):
    """Consecutive views of a 1-D ``array`` with the given sizes (several buffers of one allocation)."""
    out, at = [], 0
    for size in sizes:
        out.append(array[at:at + size])
        at += size
    return out


def radix_sort_fields(keys, bound, xp, values=None, buffers=None):
    """``(fields, result)``: the :data:`RADIX_SORT` fields that sort ``keys`` (int32, from 0 to ``bound``) and
    carry ``values`` (None: each key's index), with the buffers allocated (one array; or ``buffers``, another
    sort's of as many keys), and the view of them that will hold the sorted values."""
    n = int(keys.size)
    tile, tiles = radix_tiles(n)
    passes = -(-max(int(bound).bit_length(), 1) // RADIX_BITS)
    if buffers is None:
        buffers = xp.empty(radix_sort_size(n), dtype=xp.int32)
    at = (passes - 1) % 2 * n + 2 * n
    fields = dict(n=n, tile=tile, tiles=tiles, passes=passes, keys=keys, values=values, counts=buffers[4 * n:],
                  key_buffers=buffers, value_buffers=buffers[2 * n:])
    return fields, buffers[at:at + n]


class Pattern(NamedTuple):
    """What a format's choice and set-up need to know of a CSR pattern (:func:`pattern_stats`)."""

    nnz: int
    width: int    # the longest row
    longs: int    # rows longer than the long_row it was counted for
    columns: int  # largest column index + 1 (0 when not counted)


def pattern_stats(indptr, indices, xp=np, long_row=64, columns=False):
    """The :class:`Pattern` of a CSR pattern; ``columns``: count its columns too.

    On the device one kernel (``pattern_stats`` of ``kernels/layout.cu``) and one read back.
    """
    n = int(indptr.size) - 1
    if xp is np:
        lengths = np.diff(indptr)
        nnz = int(indptr[-1]) if n else 0
        return Pattern(nnz, int(lengths.max()) if n else 0, int((lengths > long_row).sum()),
                       int(indices[:nnz].max()) + 1 if columns and nnz else 0)
    if n == 0:
        return Pattern(0, 0, 0, 0)
    stats = xp.zeros(4, dtype=xp.int32)
    launch("layout", "pattern_stats", n, PATTERN, n=n, long_row=long_row, columns=int(columns), indptr=indptr,
           indices=indices, stats=stats)
    return Pattern(*(int(v) for v in host(stats)))


@functools.lru_cache(maxsize=None)
def matrix_struct(fields):
    """The device struct ``Matrix`` of a format's ``fields`` (made once a format)."""
    return Struct("Matrix", fields)


class MatrixFormat:
    """A CSR pattern laid out for one ``kernels/<name>.cu``.

    Subclasses set ``name`` and ``fields`` (the device struct ``Matrix``, whose
    pointer fields name array attributes of the instance, except ``val``, the
    values array passed to :meth:`pack`), build their arrays in ``__init__`` and
    record ``_src``, the CSR entry held in every slot of ``val`` (-1 for
    padding; None when ``val`` is in CSR order), and ``size``, the length of
    ``val``. The values are gathered through ``_src``: each slot is written
    once, in order, where scattering the CSR entries to their places would write
    the 8-byte values all over the array.

    Attributes
    ----------
    n, nnz : int
    defines : tuple of (str, str)
        Preprocessor definitions the format's kernel files need.
    gather : {"stored", "formed"}
        How ``gather="auto"`` has the PCG kernels read the multiplied vector: formed where
        each row's thread reads it at its columns (one thread a row), stored otherwise.
    numbering : int array or None
        Where the layout numbers the rows its own way: row ``i`` of its numbering is
        row ``numbering[i]`` of the CSR pattern (its products read and write vectors
        in that numbering); None where it keeps the given one.
    """

    name = None
    fields = ()
    defines = ()
    numbering = None
    gather = "stored"

    @property
    def kernel_files(self):
        """The files of ``kernels/`` that implement the format, in the order they are compiled."""
        return (self.name,)

    def index_bytes(self):
        """Bytes of the index arrays a product reads besides the values."""
        return self.col.nbytes

    def __init__(self, indptr, xp, nnz):
        self.xp = xp
        self.n = int(indptr.size) - 1
        self.nnz = nnz
        self.struct = matrix_struct(type(self).fields)

    def values(self, data, out=None):
        """CSR-ordered ``data`` in the format's order, 0 in the padding (written into ``out`` when given)."""
        xp, src = self.xp, self._src
        if out is None:
            out = xp.empty(self.size, dtype=data.dtype)
        if src is None:
            out[...] = data
        elif xp is np:
            out[...] = np.where(src >= 0, data[np.maximum(src, 0)], 0)
        else:
            _gather_kernel()(data, src, out)
        return out

    def csr_values(self, val):
        """The values ``val`` of this layout back in CSR order (:meth:`values` undone)."""
        if self._src is None:
            return val.copy()
        out = self.xp.empty(self.nnz, dtype=val.dtype)
        held = self._src >= 0
        out[self._src[held]] = val[held]
        return out

    def pack(self, val):
        """The device struct ``Matrix`` over this layout's arrays and the values ``val``."""
        values = {}
        for field, _ in self.fields:
            values[field] = val if field == "val" else getattr(self, field)
        return self.struct.pack(**values)

    def threads(self):
        """Threads a product kernel can keep busy (a grid of more has idle blocks)."""
        raise NotImplementedError

    def stage_steps(self, warps):
        """Steps of 32 (value, column) pairs that the warp with the most needs in shared memory to hold
        all of its part of the matrix, with ``warps`` warps in the grid (``stage_matrix`` in the
        format's kernel file); None when the format stages nothing."""
        return None

    def describe(self):
        """One line for reports: the format and what its set-up found."""
        return self.name

    def product(self, val, v):
        """NumPy meaning of ``for_each_row_product``: ``A @ v`` from the layout's arrays (host arrays), in the
        layout's numbering."""
        raise NotImplementedError


def entry_rows(indptr, xp):
    """The row of every entry of a CSR pattern (a scan, not a search: one pass over the entries)."""
    n, nnz = int(indptr.size) - 1, int(indptr[-1])
    if xp is np:
        starts = np.bincount(indptr[1:n], minlength=nnz + 1)  # empty rows put several starts at one entry
    else:  # one atomic scatter, where CuPy's bincount first reads the least and largest values back
        starts = xp.zeros(nnz + 1, dtype=xp.int32)
        xp.add.at(starts, indptr[1:n], 1)
    return xp.cumsum(starts[:nnz], dtype=xp.int32)


def increasing_rows(indptr, indices, xp=np):
    """True when a CSR pattern is canonical: its row pointers do not decrease and each row's column indices
    increase strictly (sorted, no duplicates).

    One pass over the entries (each compared with the one before unless it starts a row), where cupyx's
    ``has_canonical_format`` walks each row in one thread: on an H200 a row of 888k entries held that
    check for 21 ms, this one takes a few kernels whatever the rows' lengths."""
    nnz = int(indices.size)
    if nnz < 2:
        return bool(xp.all(xp.diff(indptr) >= 0))
    starts = xp.zeros(nnz + 1, dtype=bool)  # one past the last entry: where empty last rows start
    starts[xp.clip(indptr[:-1], 0, nnz)] = True  # clipped: a malformed pointer fails below, not out of bounds
    rising = starts[1:nnz] | (indices[1:] > indices[:-1])
    return bool(xp.all(rising) & xp.all(xp.diff(indptr) >= 0))


def window_sectors(indptr, indices, rows, window, xp=np, samples=2048, itemsize=8, renumber=None):
    """Distinct 32-byte sectors of the multiplied vector that windows of rows read, per nonzero.

    ``rows`` (an order of some or all rows of a CSR pattern) are taken ``window`` at
    a time, as the product kernels work on them together; ``samples`` windows, evenly
    spaced, are counted (all of them for smaller matrices). About 1 when each read is
    a memory transaction of its own (random numbering), well below 1 when the rows of
    a window read columns close together or the same ones. With ``renumber``, column
    j is read at ``renumber[j]`` (only the sampled entries are renumbered).
    """
    n = int(indptr.size) - 1
    groups = -(-int(rows.size) // window)
    if groups == 0:
        return 0.0
    # distinct without a unique: the samples are at most the groups, so linspace's steps are at least 1
    chosen = xp.linspace(0, groups - 1, min(groups, samples)).astype(xp.int64)
    position = (chosen[:, None] * window + xp.arange(window)[None, :]).ravel()
    position = position[position < rows.size]
    picked = rows[position].astype(xp.int64)
    starts = indptr[picked].astype(xp.int64)
    offsets = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(indptr[picked + 1] - starts)])
    total = int(offsets[-1])
    if total == 0:
        return 0.0
    of = entry_rows(offsets, xp)  # the picked row of every entry read
    entries = xp.arange(total) - offsets[of] + starts[of]
    sectors = -(-(n * itemsize) // 32)
    columns = indices[entries] if renumber is None else renumber[indices[entries]]
    keys = xp.sort(position[of] // window * sectors + columns.astype(xp.int64) * itemsize // 32)
    return (1 + int(xp.count_nonzero(keys[1:] != keys[:-1]))) / total  # distinct keys: a sort, no unique


def copy_into(out, a):
    """``out[...] = a`` for contiguous arrays of one shape and type: on the device one asynchronous copy of the
    bytes on the current stream, where CuPy's assignment launches an elementwise kernel."""
    if out.shape != a.shape or out.dtype != a.dtype or not (out.flags.c_contiguous and a.flags.c_contiguous):
        raise ValueError(f"copy_into needs contiguous arrays of one shape and type, not {out.shape} {out.dtype} "
                         f"and {a.shape} {a.dtype}")
    if not hasattr(out.data, "copy_from_device_async"):  # NumPy
        out[...] = a
    elif a.nbytes:
        out.data.copy_from_device_async(a.data, a.nbytes)


def host(a):
    """A CuPy array's host copy (NumPy arrays unchanged)."""
    return a.get() if hasattr(a, "get") else np.asarray(a)
