"""DIA: ELL whose columns lie on fixed diagonals (``kernels/slots.cu``, ``kernels/dia.cu``; laid out by
``kernels/layout.cu``)."""
import numpy as np

from ..errors import InputError
from .base import DIA_PLACE, entry_rows, host, launch, pattern_stats
from .ell import ELL


class DiagonalsDoNotFit(InputError):
    """A pattern DIA cannot hold: too many entries off its diagonals, none sampled, or too many columns."""


class DIA(ELL):
    """ELL's slots (entry of row i in slot ``k * n + i``) with no column stored: slot k of
    every row lies on diagonal k, at column ``i + offsets[k]``; the few entries off those
    diagonals are kept apart, as CSR rows of exceptions.

    The diagonals are the offsets (column less row) most frequent among :attr:`SAMPLES`
    rows spread over the matrix (:meth:`sampled_rows`), as many as its longest row has
    entries. A stencil on a grid numbered in order has every entry on them, whatever its values;
    with periodic walls, or as one rank's rows with the neighbours' halo columns, a few
    entries are not, and those are the exceptions (at most :attr:`MAX_EXCEPTIONS` of the
    entries). The product reads 8 bytes a slot where ELL reads 12, and each of its
    gathers is coalesced. A slot off the pattern's diagonals is padding (value 0, read at
    the nearest column when it falls outside them). A row adds its diagonals' entries in
    column order and then its exceptions in CSR order: for a canonical row without
    exceptions, the order ELL adds them in (the same bits).
    """

    name = "dia"
    kernel_files = ("slots", "dia")
    fields = (("val", "const real_t*"), ("n", "int"), ("columns", "int"), ("offsets", f"int[{ELL.MAX_WIDTH}]"),
              ("rest_ptr", "const int*"), ("rest_col", "const int*"))
    SAMPLES = 64  # rows whose offsets elect the diagonals
    MAX_EXCEPTIONS = 1 / 32  # of the entries: each costs about what a row of slots does less than ELL's
    NO_OFFSET = -2**31  # a sampled row's share past its entries (kernels/layout.cu, dia_sample)

    def __init__(self, indptr, indices, xp, stats=None):
        """``stats``: the pattern's :class:`~.base.Pattern` where known.

        Raises
        ------
        DiagonalsDoNotFit
            Where more than :attr:`MAX_EXCEPTIONS` of the entries lie off the
            diagonals, the sampled rows are all empty, or the rows and columns
            together reach 2^31 (a padding slot's column is computed in int).
        """
        stats = stats or pattern_stats(indptr, indices, xp)
        self._init_slots(indptr, xp, stats)
        n = self.n
        samples = min(n, self.SAMPLES)
        fields = dict(n=n, width=self.width, samples=samples, indptr=indptr, indices=indices)
        if xp is np:
            sample = np.full((samples, self.width), self.NO_OFFSET, dtype=np.int64)
            for j, r in enumerate(self.sampled_rows(n, samples)):
                row = indices[indptr[r]:indptr[r + 1]].astype(np.int64) - r
                sample[j, :row.size] = row
        else:  # one launch and one read back
            sample = xp.empty(samples * self.width, dtype=xp.int32)
            launch("layout", "dia_sample", samples, DIA_PLACE, **fields, sample=sample)
            sample = host(sample)
        self.diagonals = self.elect(sample, self.width)
        self.width = width = int(self.diagonals.size)
        if not width:
            raise DiagonalsDoNotFit(f"DIA found no diagonals: its {samples} sampled rows are empty; use the ell, sell "
                                    "or csr matrix format")
        self.defines = (("SLOT_WIDTH", str(width)),)
        self.rest_ptr = xp.zeros(n + 1, dtype=xp.int32)
        if xp is np:
            found = self._place_host(indptr, indices)
        else:  # one pass, one read back
            self._src = xp.full(width * n, -1, dtype=xp.int32)
            found = xp.zeros(2, dtype=xp.int32)
            fields.update(width=width, diagonals=xp.asarray(self.diagonals), src=self._src, stats=found,
                          rest_ptr=self.rest_ptr)
            launch("layout", "dia_place", n, DIA_PLACE, **fields)
            found = host(found)
        self.exceptions, columns = int(found[0]), int(found[1])
        if self.exceptions > self.MAX_EXCEPTIONS * self.nnz:
            raise DiagonalsDoNotFit(f"DIA holds at most {self.MAX_EXCEPTIONS:.1%} of the entries off its diagonals "
                                    f"(the {width} offsets most frequent in {samples} sampled rows); "
                                    f"{self.exceptions:,} of {self.nnz:,} lie off them: use the ell, sell or csr "
                                    "matrix format")
        self.columns = max(n, columns)  # the multiplied vector's length: ELL's padding reads it at the row too
        if n + self.columns >= 2**31:
            raise DiagonalsDoNotFit(f"DIA needs fewer than 2^31 rows and columns together ({n:,} rows, "
                                    f"{self.columns:,} columns); use the ell or sell matrix format")
        if xp is not np and self.exceptions:
            self._lay_out_exceptions(fields)
        self.size = width * n + self.exceptions
        if not self.exceptions:
            self.rest_ptr = self.rest_col = None
        self.defines += (("DIA_EXCEPTIONS", "1" if self.exceptions else "0"),)

    @property
    def offsets(self):
        """The diagonals in the kernel struct's array of :attr:`MAX_WIDTH` (``Matrix.offsets``)."""
        return np.pad(self.diagonals, (0, self.MAX_WIDTH - self.width))

    @staticmethod
    def sampled_rows(n, samples):
        """The rows whose offsets elect the diagonals (``dia_sample``): row ``n frac((j + 1) / golden ratio)`` for
        j below ``samples``, spread so that no grid's stride repeats them."""
        spread = np.fmod(np.arange(1, samples + 1, dtype=np.float64) * 0.6180339887498949, 1.0)
        return np.minimum((spread * n).astype(np.int64), n - 1)

    @classmethod
    def elect(cls, sample, width):
        """The diagonals from the sampled rows' offsets (a host array, :attr:`NO_OFFSET` past a row's entries):
        the ``width`` most frequent (ties to the smaller offset), ascending."""
        offsets, counts = np.unique(sample[sample != cls.NO_OFFSET], return_counts=True)
        return np.sort(offsets[np.argsort(-counts, kind="stable")[:width]]).astype(np.int32)

    def _lay_out_exceptions(self, fields):
        """On the device (``fields``: the layout kernels' as ``dia_place`` ran): the exceptions' row pointers (a
        scan of the counts it left), columns and CSR entries, the latter after the slots' in ``_src`` (``val``
        holds their values there)."""
        xp = self.xp
        xp.cumsum(self.rest_ptr, out=self.rest_ptr)
        self.rest_col, rest_src = (xp.empty(self.exceptions, dtype=xp.int32) for _ in range(2))
        launch("layout", "dia_rest", self.n, DIA_PLACE, **dict(fields, rest_col=self.rest_col, rest_src=rest_src))
        self._src = xp.concatenate([self._src, rest_src])

    def _place_host(self, indptr, indices):
        """What ``dia_place`` and ``dia_rest`` compute, in NumPy: fills ``_src``, ``rest_ptr`` and ``rest_col``;
        returns ``dia_place``'s ``stats``."""
        n, width, nnz = self.n, self.width, self.nnz
        diagonals = self.diagonals.astype(np.int64)
        rows = entry_rows(indptr, np)
        offset = indices[:nnz].astype(np.int64) - rows
        k = np.minimum(np.searchsorted(diagonals, offset), max(width - 1, 0))
        # a diagonal's first entry in the row takes it (a repeat is an exception)
        key = rows * (n + int(indices[:nnz].max(initial=0)) + 1) + offset + n  # offset + n in [0, n + columns)
        first = np.zeros(nnz, dtype=bool)
        first[np.unique(key, return_index=True)[1]] = True
        on = (diagonals[k] == offset) & first if width else np.zeros(nnz, dtype=bool)
        self._src = np.full(width * n, -1, dtype=np.int32)
        self._src[k[on] * n + rows[on]] = np.flatnonzero(on)
        off = np.flatnonzero(~on)
        self.rest_ptr[1:] = np.cumsum(np.bincount(rows[off], minlength=n))
        self.rest_col = indices[off].astype(np.int32)
        self._src = np.concatenate([self._src, off.astype(np.int32)])
        return np.array([off.size, int(indices[:nnz].max()) + 1 if nnz else 0])

    def index_bytes(self):
        return 0 if not self.exceptions else self.rest_ptr.nbytes + self.rest_col.nbytes

    def slot_columns(self):
        """The column of every slot as the kernel computes it, slot ``k * n + i`` (where the layout's arrays are:
        for kernels that read ELL's columns)."""
        xp = self.xp
        rows, diagonals = xp.arange(self.n, dtype=xp.int64), xp.asarray(self.diagonals, dtype=xp.int64)
        return xp.clip(diagonals[:, None] + rows[None, :], 0, self.columns - 1).astype(xp.int32).ravel()

    def product(self, val, v):
        val, slots = host(val), self.width * self.n
        out = super().product(val[:slots], v)
        if self.exceptions:  # each row's exceptions after its slots, in their order
            rest_ptr, rest_col, rest_val = host(self.rest_ptr), host(self.rest_col), val[slots:]
            counts = np.diff(rest_ptr)
            for j in range(int(counts.max())):
                rows = np.flatnonzero(counts > j)
                at = rest_ptr[rows] + j
                out[rows] = out[rows] + rest_val[at] * v[rest_col[at]]
        return out

    def describe(self):
        off = f", {self.exceptions:,} entries off them" if self.exceptions else ""
        return f"dia ({self.width} diagonals, {self.size / max(self.nnz, 1) - 1:.1%} padding{off})"
