"""DIA: ELL whose columns lie on fixed diagonals (``kernels/slots.cu``, ``kernels/dia.cu``; laid out by
``kernels/layout.cu``)."""
import numpy as np

from ..errors import InputError
from .base import DIA_PLACE, entry_rows, host, launch, pattern_stats
from .ell import ELL


class DiagonalsDoNotFit(InputError):
    """A pattern DIA cannot hold: an entry off the diagonals of its widest row, or too many columns."""


class DIA(ELL):
    """ELL's slots (entry of row i in slot ``k * n + i``) with no column stored: slot k of
    every row lies on diagonal k, at column ``i + offsets[k]``.

    The diagonals are those of a widest row (its columns less its index, ascending),
    so DIA holds a pattern whose every row's entries lie on them: a stencil on a grid
    numbered in order, whatever its values. Its slots are ELL's, as many and with the
    same padding; the product reads 8 bytes a slot where ELL reads 12, and each of its
    gathers is coalesced. A slot off the pattern's diagonals is padding (value 0, read
    at the nearest column when it falls outside them). Rows keep their entries in
    column order, so a row's sum is added in the order ELL adds it: the same bits.
    """

    name = "dia"
    kernel_files = ("slots", "dia")
    fields = (("val", "const real_t*"), ("n", "int"), ("columns", "int"), ("offsets", f"int[{ELL.MAX_WIDTH}]"))

    def __init__(self, indptr, indices, xp, stats=None):
        """``stats``: the pattern's :class:`~.base.Pattern` where known.

        Raises
        ------
        DiagonalsDoNotFit
            Where an entry lies off the diagonals of the widest row, or the rows and
            columns together reach 2^31 (a padding slot's column is computed in int).
        """
        stats = stats or pattern_stats(indptr, indices, xp)
        self._init_slots(indptr, xp, stats)
        n, width = self.n, self.width
        if xp is np:
            found = self._place_host(indptr, indices)
        else:  # the same arrays in two passes (kernels/layout.cu) and one read back
            self._src = xp.full(width * n, -1, dtype=xp.int32)
            found = xp.zeros(3 + width, dtype=xp.int32)
            found[2] = n
            fields = dict(n=n, width=width, indptr=indptr, indices=indices, src=self._src, stats=found)
            launch("layout", "dia_widest", n, DIA_PLACE, **fields)
            launch("layout", "dia_place", n, DIA_PLACE, **fields)
            found = host(found)
        misses, columns, widest = (int(v) for v in found[:3])
        if misses:
            raise DiagonalsDoNotFit(f"DIA needs every entry on a diagonal of the widest row (row {widest}, "
                                    f"{width} entries); {misses:,} entries lie off them: use the ell, sell or csr "
                                    "matrix format")
        self.columns = max(n, columns)  # the multiplied vector's length: ELL's padding reads it at the row too
        if n + self.columns >= 2**31:
            raise DiagonalsDoNotFit(f"DIA needs fewer than 2^31 rows and columns together ({n:,} rows, "
                                    f"{self.columns:,} columns); use the ell or sell matrix format")
        self.diagonals = np.asarray(found[3:3 + width], dtype=np.int32)
        self.offsets = np.zeros(self.MAX_WIDTH, dtype=np.int32)
        self.offsets[:width] = self.diagonals

    def _place_host(self, indptr, indices):
        """What ``dia_widest`` and ``dia_place`` compute, in NumPy: fills ``_src``, returns their ``stats``."""
        n, width, nnz = self.n, self.width, self.nnz
        widest = int(np.argmax(np.diff(indptr) == width))
        diagonals = indices[indptr[widest]:indptr[widest + 1]].astype(np.int64) - widest
        rows = entry_rows(indptr, np)
        offset = indices[:nnz].astype(np.int64) - rows
        k = np.minimum(np.searchsorted(diagonals, offset), width - 1)
        # an entry must also follow its row's previous one: out of order or repeated, the kernel's walk misses it
        rising = np.ones(nnz, dtype=bool)
        rising[1:] = (rows[1:] != rows[:-1]) | (offset[1:] > offset[:-1])
        on = (diagonals[k] == offset) & rising
        self._src = np.full(width * n, -1, dtype=np.int32)
        self._src[k[on] * n + rows[on]] = np.flatnonzero(on)
        columns = int(indices[:nnz].max()) + 1 if nnz else 0
        return np.concatenate([[nnz - int(on.sum()), columns, widest], diagonals]).astype(np.int64)

    def index_bytes(self):
        return 0

    def slot_columns(self):
        """The column of every slot as the kernel computes it, slot ``k * n + i`` (where the layout's arrays are:
        for kernels that read ELL's columns)."""
        xp = self.xp
        rows, diagonals = xp.arange(self.n, dtype=xp.int64), xp.asarray(self.diagonals, dtype=xp.int64)
        return xp.clip(diagonals[:, None] + rows[None, :], 0, self.columns - 1).astype(xp.int32).ravel()

    def describe(self):
        return f"dia ({self.width} diagonals, {self.size / max(self.nnz, 1) - 1:.1%} padding)"
