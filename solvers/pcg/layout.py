"""The storage the PCG kernels read: ELL for regular row lengths, CSR otherwise.

One rule for every GPU driver (single GPU and distributed), on NumPy or CuPy arrays.
"""
import numpy as np


def subwarp(nnz, n):
    """Lanes per CSR row: the power of two at or above the mean row length, 2 to 32.

    A typical row is then read in one round of loads by its lanes.
    """
    mean = max(nnz / max(n, 1), 1.0)
    return int(min(32, max(2, 2 ** int(np.ceil(np.log2(mean))))))


class MatrixLayout:
    """A CSR pattern laid out for ``kernels/pcg.cu``.

    ELL (column-major: entry k of row i at ``k * n + i``; padding has value 0
    and points at its own row) when rows have nearly equal lengths, as for
    stencils: one thread a row, coalesced loads. CSR otherwise.

    Parameters
    ----------
    indptr, indices : int32 arrays (NumPy or CuPy)
        The CSR pattern (n + 1 and nnz entries).
    xp : module
        ``numpy`` or ``cupy``: where the arrays live.

    Attributes
    ----------
    rowptr, col : int32 arrays
        What the kernels take as row pointers (a dummy for ELL) and columns.
    defines : tuple
        Preprocessor definitions selecting the layout in ``pcg.cu``.
    lanes : int
        Threads per row.
    """

    def __init__(self, indptr, indices, xp=np):
        self.xp = xp
        n, nnz = int(indptr.size) - 1, int(indices.size)
        self.n, self.nnz = n, nnz
        width = int(xp.diff(indptr).max())
        self.format = "ell" if width <= 32 and width <= 1.3 * nnz / n + 1 else "csr"
        if self.format == "ell":
            rows = xp.searchsorted(indptr, xp.arange(nnz, dtype=indptr.dtype), side="right") - 1
            self._pos = (xp.arange(nnz) - indptr[rows]) * n + rows
            self.col = xp.tile(xp.arange(n, dtype=xp.int32), width)
            self.col[self._pos] = indices
            self.rowptr = xp.zeros(1, dtype=xp.int32)  # unused by the ELL kernels
            self.size, self.lanes, self.defines = width * n, 1, (("ELL_WIDTH", str(width)),)
        else:
            self._pos = None
            self.rowptr, self.col = indptr, indices
            self.lanes = subwarp(nnz, n)
            self.size, self.defines = nnz, (("SUBWARP", str(self.lanes)),)

    def values(self, data, out=None):
        """CSR-ordered ``data`` in the kernel layout (written into ``out`` when given)."""
        if out is None:
            out = self.xp.zeros(self.size, dtype=data.dtype)
        if self._pos is None:
            out[...] = data
        else:
            out[self._pos] = data
        return out
