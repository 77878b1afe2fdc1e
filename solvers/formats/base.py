"""What every matrix format provides (see :mod:`solvers.formats`)."""
import numpy as np

from ..kernels.structs import Struct


class MatrixFormat:
    """A CSR pattern laid out for one ``kernels/<name>.cu``.

    Subclasses set ``name`` and ``fields`` (the device struct ``Matrix``, whose
    pointer fields name array attributes of the instance, except ``val``, the
    values array passed to :meth:`pack`), build their arrays in ``__init__`` and
    record ``_pos``, the position of every CSR entry in ``val`` (or None when
    the order is unchanged), and ``size``, the length of ``val``.

    Attributes
    ----------
    n, nnz : int
    defines : tuple of (str, str)
        Preprocessor definitions the format's kernel file needs.
    """

    name = None
    fields = ()
    defines = ()

    def __init__(self, indptr, xp):
        self.xp = xp
        self.n = int(indptr.size) - 1
        self.nnz = int(indptr[-1]) if self.n else 0
        self.struct = Struct("Matrix", self.fields)

    def values(self, data, out=None):
        """CSR-ordered ``data`` in the format's order (written into ``out`` when given)."""
        if out is None:
            out = self.xp.zeros(self.size, dtype=data.dtype)
        if self._pos is None:
            out[...] = data
        else:
            out[self._pos] = data
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

    def describe(self):
        """One line for reports: the format and what its set-up found."""
        return self.name

    def product(self, val, v):
        """NumPy meaning of ``for_each_row_product``: ``A @ v`` from the layout's arrays (host arrays)."""
        raise NotImplementedError


def entry_rows(indptr, xp):
    """The row of every entry of a CSR pattern (a scan, not a search: one pass over the entries)."""
    n, nnz = int(indptr.size) - 1, int(indptr[-1])
    starts = xp.bincount(indptr[1:n], minlength=nnz + 1)  # empty rows put several starts at one entry
    return xp.cumsum(starts[:nnz], dtype=xp.int32)


def window_sectors(indptr, indices, rows, window, xp=np, samples=2048, itemsize=8):
    """Distinct 32-byte sectors of the multiplied vector that windows of rows read, per nonzero.

    ``rows`` (an order of some or all rows of a CSR pattern) are taken ``window`` at
    a time, as the product kernels work on them together; ``samples`` windows, evenly
    spaced, are counted (all of them for smaller matrices). About 1 when each read is
    a memory transaction of its own (random numbering), well below 1 when the rows of
    a window read columns close together or the same ones.
    """
    n = int(indptr.size) - 1
    groups = -(-int(rows.size) // window)
    if groups == 0:
        return 0.0
    chosen = xp.unique(xp.linspace(0, groups - 1, min(groups, samples)).astype(xp.int64))
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
    keys = position[of] // window * sectors + indices[entries].astype(xp.int64) * itemsize // 32
    return int(xp.unique(keys).size) / total


def host(a):
    """A CuPy array's host copy (NumPy arrays unchanged)."""
    return a.get() if hasattr(a, "get") else np.asarray(a)
