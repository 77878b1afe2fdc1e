"""Reading and writing matrices and vectors, with validation before any solve.

Every problem found raises :class:`~solvers.errors.InputError` whose message
names the file and says what is wrong in one line.
"""
import inspect
import os

import numpy as np
import scipy.io
import scipy.sparse as sp

from .errors import InputError

# SciPy >= 1.15 can return sparse arrays; ask for them where offered (the matrix default is deprecated).
_MMREAD_KWARGS = {"spmatrix": False} if "spmatrix" in inspect.signature(scipy.io.mmread).parameters else {}

#: Relative asymmetry ``max|A - A^T| / max|A|`` accepted as rounding noise.
SYMMETRY_RTOL = 1e-10


def _first_line(exc):
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _mmread(path):
    """``scipy.io.mmread`` with existence checks and one-line errors."""
    if not os.path.exists(path):
        raise InputError("no such file", path)
    if os.path.isdir(path):
        raise InputError("is a directory, not a Matrix Market file", path)
    if os.path.getsize(path) == 0:
        raise InputError("empty file", path)
    try:
        rows, cols, entries, fmt, field, symmetry = scipy.io.mminfo(path)
    except Exception as exc:
        raise InputError(f"bad Matrix Market header ({_first_line(exc)})", path) from None
    if field == "complex":
        raise InputError("complex matrices are not supported (need real or integer)", path)
    if field == "pattern":
        raise InputError("pattern-only matrix has no values (need real or integer)", path)
    try:
        data = scipy.io.mmread(path, **_MMREAD_KWARGS)
    except Exception as exc:
        raise InputError(f"cannot parse Matrix Market data ({_first_line(exc)})", path) from None
    return data, (rows, cols, entries, fmt, field, symmetry)


def read_matrix(path, dtype=np.float64, check_symmetric=True):
    """Read and validate a square, real, finite, symmetric sparse matrix.

    Parameters
    ----------
    path : str
        Matrix Market file (``coordinate`` or ``array``, ``real`` or
        ``integer``, ``general`` or ``symmetric``; ``.gz`` allowed).
    dtype : dtype
        Floating type of the returned matrix.
    check_symmetric : bool
        Reject matrices whose relative asymmetry exceeds :data:`SYMMETRY_RTOL`.

    Returns
    -------
    scipy.sparse.csr_matrix
    """
    data, (rows, cols, *_rest) = _mmread(path)
    if rows != cols:
        raise InputError(f"matrix is not square ({rows} x {cols})", path)
    if rows == 0:
        raise InputError("matrix is empty (0 x 0)", path)
    A = sp.csr_matrix(data, dtype=np.float64)
    A.sum_duplicates()
    if A.nnz == 0:
        raise InputError(f"matrix has no nonzero entries ({rows} x {cols})", path)
    if not np.all(np.isfinite(A.data)):
        bad = int(np.count_nonzero(~np.isfinite(A.data)))
        raise InputError(f"matrix has {bad} NaN or Inf entries", path)
    if check_symmetric:
        check_symmetry(A, path)
    return A.astype(dtype, copy=False)


def check_symmetry(A, source="matrix"):
    """Raise :class:`InputError` when ``A`` is not symmetric up to rounding."""
    scale = float(abs(A).max())
    asym = float(abs(A - A.T).max()) if A.nnz else 0.0
    if asym > SYMMETRY_RTOL * scale:
        raise InputError(
            f"matrix is not symmetric (max |A - A^T| = {asym:.3g}, {asym / scale:.2g} relative); "
            "CG needs a symmetric positive definite matrix", source)


def read_vector(path, n=None, dtype=np.float64):
    """Read a vector from ``.npy``, ``.txt`` or a Matrix Market array / n x 1 matrix.

    Parameters
    ----------
    n : int, optional
        Expected length; a mismatch raises :class:`InputError`.
    """
    if not os.path.exists(path):
        raise InputError("no such file", path)
    try:
        if path.endswith(".npy"):
            v = np.load(path, allow_pickle=False)
        elif path.endswith((".txt", ".dat", ".csv")):
            v = np.loadtxt(path, delimiter="," if path.endswith(".csv") else None, ndmin=1)
        else:
            v, _info = _mmread(path)
            v = v.toarray() if sp.issparse(v) else np.asarray(v)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"cannot read vector ({_first_line(exc)})", path) from None
    if np.iscomplexobj(v):
        raise InputError("complex vectors are not supported", path)
    if v.ndim == 2 and 1 in v.shape:
        v = v.reshape(-1)
    if v.ndim != 1:
        raise InputError(f"expected a vector, got an array of shape {v.shape}", path)
    if n is not None and v.shape[0] != n:
        raise InputError(f"vector has {v.shape[0]} entries but the matrix has {n} rows", path)
    try:
        v = v.astype(dtype)
    except (TypeError, ValueError) as exc:
        raise InputError(f"non-numeric vector ({_first_line(exc)})", path) from None
    if not np.all(np.isfinite(v)):
        raise InputError("vector has NaN or Inf entries", path)
    return v


def write_vector(path, x):
    """Write ``x`` as ``.npy`` or as a Matrix Market ``array`` (any other suffix)."""
    x = np.asarray(x)
    if path.endswith(".npy"):
        np.save(path, x)
    else:
        scipy.io.mmwrite(path, x.reshape(-1, 1), comment="solution written by graphsolve-cuda")
