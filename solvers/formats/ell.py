"""ELL: fixed-width rows, column-major (``kernels/slots.cu``, ``kernels/ell.cu``; laid out by ``kernels/layout.cu``)."""
import numpy as np

from ..errors import InputError
from .base import ELL_PLACE, MatrixFormat, entry_rows, host, launch, pattern_stats


class ELL(MatrixFormat):
    """Entry k of row i at ``k * n + i``; padding has value 0 and points at its own row.

    One thread a row, every load coalesced; the width is a compile-time constant,
    so the kernel keeps a whole row's loads in flight. For stencils.
    """

    name = "ell"
    kernel_files = ("slots", "ell")
    gather = "formed"
    fields = (("col", "const int*"), ("val", "const real_t*"), ("n", "int"))
    exceptions = 0  # entries held apart from the slots (DIA's)
    AUTO_WIDTH = 32  # the longest rows auto lays out as ELL
    MAX_WIDTH = 64   # the longest rows the kernel's unrolled loop takes

    @classmethod
    def suits(cls, width, nnz, n):
        """True when rows of at most ``width`` entries (``nnz`` in ``n`` rows) pad little."""
        return 0 < width <= cls.AUTO_WIDTH and width <= 1.3 * nnz / n + 1

    def __init__(self, indptr, indices, xp, stats=None):
        """``stats``: the pattern's :class:`~.base.Pattern` where known."""
        stats = stats or pattern_stats(indptr, indices, xp)
        self._init_slots(indptr, xp, stats)
        n, nnz = self.n, self.nnz
        if xp is np:
            rows = entry_rows(indptr, xp)
            place = (np.arange(nnz, dtype=np.int32) - indptr[rows]) * np.int32(n) + rows
            self.col = np.tile(np.arange(n, dtype=np.int32), self.width)
            self.col[place] = indices
            self._src = np.full(self.width * n, -1, dtype=np.int32)
            self._src[place] = np.arange(nnz, dtype=np.int32)
        else:  # the same arrays in one pass (kernels/layout.cu)
            self._src, self.col = (xp.empty(self.width * n, dtype=xp.int32) for _ in range(2))
            launch("layout", "ell_place", n, ELL_PLACE, n=n, width=self.width, indptr=indptr, indices=indices,
                   col=self.col, src=self._src)

    def _init_slots(self, indptr, xp, stats):
        """What every layout in column-major slots sets: the sizes, from the pattern's ``stats``."""
        super().__init__(indptr, xp, stats.nnz)
        self.width = stats.width
        if not 0 < self.width <= self.MAX_WIDTH or self.width * self.n >= 2**31 - 1:
            raise InputError(f"{self.name.upper()} needs rows of 1 to {self.MAX_WIDTH} entries and fewer than 2^31 "
                             f"slots (the longest row has {self.width}); use the sell or csr matrix format")
        self.size = self.width * self.n
        self.defines = (("SLOT_WIDTH", str(self.width)),)

    def threads(self):
        return self.n

    def describe(self):
        return f"ell (width {self.width}, {self.size / max(self.nnz, 1) - 1:.1%} padding)"

    def slot_columns(self):
        """The column of every slot, slot ``k * n + i`` (where the layout's arrays are)."""
        return self.col

    def product(self, val, v):
        val, col, n = host(val), host(self.slot_columns()), self.n
        out = 0.0
        for k in range(self.width):
            out = out + val[k * n:(k + 1) * n] * v[col[k * n:(k + 1) * n]]
        return out
