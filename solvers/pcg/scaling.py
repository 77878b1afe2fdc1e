"""Power-of-two scaling that keeps PCG's inner products away from underflow and overflow.

A system whose entries are tiny (1e-300) or huge (1e300), or outside float32's
range when solved in float32, has squared norms that underflow to 0 or
overflow to inf: ``||b||`` comes out 0, the tolerance 0, and a solve reports
"converged in 0 iterations" with ``x = 0``. Multiplying ``A`` and ``b`` by
powers of two changes exponents only, never mantissas, so the scaled system's
iterates are exactly the original ones, shifted in exponent. A solver scales
``A`` by ``2**a`` and ``b`` by ``2**c`` when their largest entries leave a safe
band of the working precision, solves ``(2**a A) x' = 2**c b``, and returns
``x = 2**(a - c) x'``. Well-scaled systems (nearly all) are not copied.
"""
import math

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from ..backend import is_cupy_sparse, is_device_array


def safe_band(dtype):
    """``(lo, hi)``: largest entries in this range need no scaling in ``dtype``.

    A quarter of the exponent range each way, so that products of a few such
    numbers (squares in the norms, ``p . A p``) stay normal.
    """
    e = np.finfo(dtype).maxexp // 4
    return 2.0 ** -e, 2.0 ** e


def shift_for(largest, dtype):
    """The ``k`` that brings ``largest * 2**k`` into ``[0.5, 1)``, or 0 when ``largest`` is in the band.

    Zero, NaN and Inf need no scaling (they are reported by the solver as they are).
    """
    lo, hi = safe_band(dtype)
    if not (largest > 0 and math.isfinite(largest)) or lo <= largest <= hi:
        return 0
    return -math.frexp(largest)[1]


def _device_array(a):
    import cupy
    return cupy.asarray(a) if hasattr(a, "__cuda_array_interface__") else cupy.from_dlpack(a)


def largest_entry(a):
    """``max |a_ij|`` of a matrix or vector (host, CuPy, cupyx or any DLPack array) as a float.

    None for a :class:`~scipy.sparse.linalg.LinearOperator`, whose entries are not at hand.
    """
    if isinstance(a, spla.LinearOperator):
        return None
    if sp.issparse(a) or is_cupy_sparse(a):
        return _largest_magnitude(a.data)
    if is_device_array(a):
        return _largest_magnitude(_device_array(a))
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.number):
        return 0.0  # the solver's own checks say what is wrong with it
    return _largest_magnitude(a)


def _largest_magnitude(values):
    """``max |v|`` of a NumPy or CuPy array from its largest and smallest values: two reductions and no
    array of magnitudes (a matrix's entries can be hundreds of megabytes). NaN if there is one."""
    if values.size == 0:
        return 0.0
    return max(float(values.max()), -float(values.min()))


def scaled(a, k):
    """``a * 2**k`` exactly (a new matrix or array of the same kind; ``a`` itself when ``k`` is 0)."""
    if not k:
        return a
    if sp.issparse(a) or is_cupy_sparse(a):
        out = a.copy()
        out.data = _ldexp(out.data, k)
        return out
    if is_device_array(a):
        return _ldexp(_device_array(a), k)
    a = np.asarray(a)
    return np.ldexp(a if np.issubdtype(a.dtype, np.floating) else a.astype(np.float64), k)


def scaled_columns(a, shifts):
    """``a[:, j] * 2**shifts[j]`` exactly for every column of a 2-D array (``a`` itself when no shift)."""
    shifts = np.asarray(shifts, dtype=np.int32)
    if not shifts.any():
        return a
    if is_device_array(a):
        import cupy
        a = _device_array(a)
        return cupy.ldexp(a if a.dtype.kind == "f" else a.astype(cupy.float64), cupy.asarray(shifts)[None, :])
    a = np.asarray(a)
    return np.ldexp(a if np.issubdtype(a.dtype, np.floating) else a.astype(np.float64), shifts[None, :])


def _ldexp(v, k):
    if isinstance(v, np.ndarray):
        return np.ldexp(v, k)
    import cupy
    return cupy.ldexp(v, k)


def rescale_in_place(v, k):
    """``v *= 2**k`` exactly, for a NumPy or CuPy float array."""
    if k:
        v[...] = _ldexp(v, k)


def rhs_shift(b_norm, dtype, largest):
    """The power of two for a right-hand side of norm ``b_norm``.

    0 while ``b_norm`` is in the safe band (nearly always, at no cost); else
    taken from ``largest()``, the largest entry of ``b`` as given (before its
    rounding to ``dtype``, which may have flushed or overflowed it).
    """
    lo, hi = safe_band(dtype)
    if lo <= b_norm <= hi:
        return 0
    return shift_for(largest(), dtype)


def restore(x, history, norms, b_shift, x_shift):
    """Undo the scaling of a solve: ``x`` in place; returns the history and the ``norms`` scaled back.

    ``norms`` are values in units of ``b`` (``||b||``, residual norms, the tolerance).
    """
    rescale_in_place(x, -x_shift)
    if history is not None:
        history = np.ldexp(np.asarray(history, dtype=np.float64), -b_shift)
    return history, [math.ldexp(v, -b_shift) for v in norms]
