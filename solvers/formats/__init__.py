"""Sparse matrix formats of the GPU kernels: one class a format, chosen at set-up.

Each format is a host class here (it lays a CSR pattern out in the format's
arrays, with NumPy or CuPy, and says in NumPy what the kernel computes) and a
device file ``kernels/<name>.cu`` implementing ``for_each_row_product`` (see
``kernels/matrix.cu``). The PCG kernels are compiled with the chosen one, so a
new format is one module here, one ``.cu`` file and their tests.

* :class:`~.ell.ELL`: rows of nearly equal length (meshes), one thread a row.
* :class:`~.dia.DIA`: ELL whose entries lie on the diagonals of its widest row
  (stencils on grids numbered in order): no column stored.
* :class:`~.sell.SELL`: anything else; rows sorted by length in slices of 32,
  very long rows split into pieces shared by several warps.
* :class:`~.csr.CSR`: plain CSR, a few lanes a row (on request).
"""
import numpy as np

from ..errors import InputError
from .base import pattern_stats
from .csr import CSR
from .dia import DIA, DiagonalsDoNotFit
from .ell import ELL
from .sell import SELL

FORMATS = {cls.name: cls for cls in (DIA, ELL, SELL, CSR)}


def row_lengths(indptr, xp=np):
    """Entries per row of a CSR pattern."""
    return xp.diff(indptr)


def choose_format(indptr, indices, xp=np, requested="auto", sell_lanes=None, sell_rows="length", renumber=False):
    """The format for a CSR pattern: ``requested``, or by ``auto`` from its row lengths.

    ``auto`` takes ELL's slots when every row has nearly the mean length (at most 1.3
    times it plus one, and at most 32 entries: the padding stays small and each
    thread's loads fit in registers), as DIA where every entry lies on a diagonal of
    the widest row (its set-up finds out: one pass and one read back more), else as
    ELL; SELL otherwise.

    Parameters
    ----------
    indptr, indices : int32 arrays (NumPy or CuPy)
    xp : module
        ``numpy`` or ``cupy``: where the arrays live and the layout is built.
    requested : {"auto", "dia", "ell", "sell", "csr"}
    sell_lanes : int, optional
        Threads a row of SELL (default :meth:`~.sell.SELL.auto_lanes`).
    sell_rows : {"auto", "neighbours", "length"}
        Row order of SELL (see :class:`~.sell.SELL`); the PCG solver asks for ``auto``.
    renumber : bool
        Let SELL number the rows as it lays them out, where that pays (:attr:`~.sell.SELL.numbering`).

    Returns
    -------
    DIA, ELL, SELL or CSR
    """
    if requested not in ("auto", *FORMATS):
        raise InputError(f"matrix format must be auto or one of {', '.join(FORMATS)}, not {requested!r}")
    # one pass over the pattern, read back once, serves the choice and the chosen format's set-up
    stats = pattern_stats(indptr, indices, xp, SELL.LONG_ROW, columns=requested in ("auto", "sell")
                          and sell_rows != "length")
    if requested == "auto" and ELL.suits(stats.width, stats.nnz, int(indptr.size) - 1):
        try:
            return DIA(indptr, indices, xp, stats)
        except DiagonalsDoNotFit:
            requested = "ell"
    if requested == "auto":
        requested = "sell"
    if requested == "sell":
        return SELL(indptr, indices, xp, sell_lanes, sell_rows, stats, renumber)
    return FORMATS[requested](indptr, indices, xp, stats)
