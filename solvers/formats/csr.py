"""CSR, a few lanes a row (``kernels/csr.cu``)."""
import numpy as np

from .base import MatrixFormat, host, pattern_stats


def row_lanes(nnz, n):
    """Lanes per row: the power of two at or above the mean row length, 2 to 32.

    A typical row is then read in one round of loads by its lanes.
    """
    mean = max(nnz / max(n, 1), 1.0)
    return int(min(32, max(2, 2 ** int(np.ceil(np.log2(mean))))))


class CSR(MatrixFormat):
    """The CSR arrays as they are; each row read by ``lanes`` threads."""

    name = "csr"
    fields = (("rowptr", "const int*"), ("col", "const int*"), ("val", "const real_t*"), ("n", "int"))

    def __init__(self, indptr, indices, xp, stats=None):
        """``stats``: the pattern's :class:`~.base.Pattern` where known."""
        super().__init__(indptr, xp, (stats or pattern_stats(indptr, indices, xp)).nnz)
        self.rowptr, self.col = indptr, indices
        self._src = None
        self.size = self.nnz
        self.lanes = row_lanes(self.nnz, self.n)
        self.defines = (("ROW_LANES", str(self.lanes)),)

    def threads(self):
        return self.n * self.lanes

    def describe(self):
        return f"csr ({self.lanes} lanes a row)"

    def product(self, val, v):
        import scipy.sparse as sp
        return sp.csr_matrix((host(val), host(self.col), host(self.rowptr)), shape=(self.n, v.size)) @ v
