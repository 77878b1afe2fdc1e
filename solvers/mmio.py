"""Reading and writing matrices and vectors, with validation before any solve.

Every problem found raises :class:`~solvers.errors.InputError` whose message
names the file and says what is wrong in one line.

Matrix Market files are read strictly. The header is parsed here; the entries
in one pass by NumPy's C text reader (:func:`numpy.loadtxt`, integer row and
column fields), which accepts nothing but a whole number in each field:
``2,50``, ``2.0abc``, ``1_000``, ``2.5.5``, ``0x1p1``, an extra column, or
``2.5`` in an ``integer`` file are refused, where SciPy's reader
(fast_matrix_market) takes a prefix of the field and goes on. Only a file the
reader refuses is scanned again, line by line in Python, to name the first bad
line and what is wrong with it.
Before any entry is read, the memory the matrix will take is estimated from
the header and compared with the memory available.
"""
import contextlib
import dataclasses
import gzip
import os
import re
import warnings
import zlib

import numpy as np
import scipy.sparse as sp

from .errors import InputError
from .outfiles import AtomicFile, check_target
from .resources import require_host_memory

#: Relative asymmetry ``max|A - A^T| / max|A|`` accepted as rounding noise.
SYMMETRY_RTOL = 1e-10

#: Suffixes of the vector formats :func:`write_vector` writes, longest first.
VECTOR_FORMATS = (".mtx.gz", ".mtx", ".npy", ".txt")

_INTEGER = re.compile(r"[+-]?[0-9]+")
_REAL = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan)", re.IGNORECASE)
_FIELDS = {"real": "real", "double": "real", "integer": "integer", "complex": "complex", "pattern": "pattern"}
_SYMMETRIES = ("general", "symmetric", "skew-symmetric", "hermitian")


def _count(n):
    """``n`` for a message: digits grouped, or three significant digits when it is enormous."""
    return f"{n:,}" if n < 10**12 else f"{n:.3g}"


def _first_line(exc):
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@dataclasses.dataclass(frozen=True)
class MatrixHeader:
    """What a Matrix Market header declares.

    Attributes
    ----------
    rows, cols : int
    stored : int
        Entries the file holds (for ``array``: the values listed).
    format : {"coordinate", "array"}
    field : {"real", "integer"}
    symmetry : {"general", "symmetric"}
    size_line : int
        Line number of the size line; entries follow it.
    """

    rows: int
    cols: int
    stored: int
    format: str
    field: str
    symmetry: str
    size_line: int

    @property
    def entries(self):
        """Nonzeros of the whole matrix at most (a symmetric file stores one triangle)."""
        return 2 * self.stored if self.symmetry == "symmetric" else self.stored


def _open_text(path):
    """Open a plain or gzipped file as text; Latin-1 so that every byte decodes (the parser judges)."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rt", encoding="latin-1") if gz else open(path, encoding="latin-1")


def _check_file(path):
    if not os.path.exists(path):
        raise InputError("no such file", path)
    if os.path.isdir(path):
        raise InputError("is a directory, not a Matrix Market file", path)
    if not os.path.isfile(path):
        raise InputError("is not a regular file", path)
    if os.path.getsize(path) == 0:
        raise InputError("empty file", path)


@contextlib.contextmanager
def _reading(path):
    """Turn failures to read the file itself (not its content) into one-line InputErrors."""
    try:
        yield
    except InputError:
        raise
    except (OSError, EOFError, zlib.error) as exc:  # unreadable, or a damaged or cut gzip stream
        raise InputError(f"cannot read file ({_first_line(exc)})", path) from None


def _parse_banner(line, path):
    tokens = line.split()
    if not tokens or tokens[0] != "%%MatrixMarket":
        raise InputError("bad Matrix Market header (line 1 must start with %%MatrixMarket)", path)
    if len(tokens) != 5:
        raise InputError("bad Matrix Market header (line 1 must read "
                         "'%%MatrixMarket matrix <format> <field> <symmetry>')", path)
    obj, fmt, field, symmetry = (t.lower() for t in tokens[1:])
    if obj != "matrix":
        raise InputError(f"bad Matrix Market header (object {tokens[1]!r}; only 'matrix' is supported)", path)
    if fmt not in ("coordinate", "array"):
        raise InputError(f"bad Matrix Market header (format {tokens[2]!r}; need coordinate or array)", path)
    if field not in _FIELDS:
        raise InputError(f"bad Matrix Market header (field {tokens[3]!r}; need real or integer)", path)
    if symmetry not in _SYMMETRIES:
        raise InputError(f"bad Matrix Market header (symmetry {tokens[4]!r}; need general or symmetric)", path)
    field = _FIELDS[field]
    if field == "complex" or symmetry == "hermitian":
        raise InputError("complex matrices are not supported (need real or integer)", path)
    if field == "pattern":
        raise InputError("pattern-only matrix has no values (need real or integer)", path)
    if symmetry == "skew-symmetric":
        raise InputError("skew-symmetric matrices are not supported (CG needs a symmetric positive definite "
                         "matrix)", path)
    return fmt, field, symmetry


def read_header(path):
    """Read and check the header of a Matrix Market file.

    Returns
    -------
    MatrixHeader
    """
    path = os.fspath(path)
    _check_file(path)
    with _reading(path), _open_text(path) as f:
        fmt, field, symmetry = _parse_banner(f.readline(), path)
        lineno, size = 1, None
        for line in f:
            lineno += 1
            text = line.strip()
            if text and not text.startswith("%"):
                size = text.split()
                break
    if size is None:
        raise InputError("truncated: the header has no size line", path)
    want = ("rows", "columns", "entries") if fmt == "coordinate" else ("rows", "columns")
    if len(size) != len(want) or not all(_INTEGER.fullmatch(t) for t in size) or any(int(t) < 0 for t in size):
        raise InputError(f"line {lineno}: bad size line {' '.join(size)!r} (need {len(want)} integers >= 0: "
                         f"{' '.join(want)})", path)
    rows, cols = int(size[0]), int(size[1])
    if fmt == "coordinate":
        stored = int(size[2])
    elif symmetry == "symmetric":
        if rows != cols:
            raise InputError(f"line {lineno}: a symmetric matrix must be square, got {rows} x {cols}", path)
        stored = rows * (rows + 1) // 2
    else:
        stored = rows * cols
    return MatrixHeader(rows, cols, stored, fmt, field, symmetry, lineno)


def _entry_dtype(header):
    value = np.int64 if header.field == "integer" else np.float64
    if header.format == "array":
        return np.dtype(value)
    return np.dtype([("row", np.int64), ("col", np.int64), ("value", value)])


def _diagnose(path, header):
    """The first bad data line of ``path`` and what is wrong with it, or None."""
    coordinate = header.format == "coordinate"
    value_kind = "an integer" if header.field == "integer" else "a number"
    value_re = _INTEGER if header.field == "integer" else _REAL
    count = 0
    with _reading(path), _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if lineno <= header.size_line:
                continue
            tokens = line.split("%", 1)[0].split()  # the reader's comment rule
            if not tokens:
                continue
            count += 1
            where = f"line {lineno}"
            if count > header.stored:
                return f"{where}: more entries than the {header.stored:,} the header declares"
            want = 3 if coordinate else 1
            if len(tokens) != want:
                layout = "row column value" if coordinate else "one value per line"
                return f"{where}: expected {want} field{'s' if want > 1 else ''} ({layout}), found {len(tokens)}"
            if coordinate:
                for token, name, limit in ((tokens[0], "row", header.rows), (tokens[1], "column", header.cols)):
                    if not _INTEGER.fullmatch(token):
                        return f"{where}: {name} index {token!r} is not an integer"
                    if not 1 <= int(token) <= limit:
                        return f"{where}: {name} index {int(token)} is outside 1..{limit}"
            if not value_re.fullmatch(tokens[-1]):
                extra = " (the header says integer)" if header.field == "integer" else ""
                return f"{where}: {tokens[-1]!r} is not {value_kind}{extra}"
    return None


def _bad_entries(path, header, fallback):
    """InputError for a file the reader refused: the first bad line when it can be found."""
    found = _diagnose(path, header)
    return InputError(found or f"cannot parse Matrix Market data ({fallback})", path)


def read_entries(path, header=None):
    """The entries of a Matrix Market file as a SciPy COO matrix (float64), strictly validated.

    Parameters
    ----------
    path : str
    header : MatrixHeader, optional
        Already read by :func:`read_header`.

    Returns
    -------
    scipy.sparse.coo_matrix
        Symmetric files expanded to both triangles; duplicates not yet summed.
    """
    path = os.fspath(path)
    header = read_header(path) if header is None else header
    # parsed entries (plus the positions of array entries), the COO arrays (24 bytes per nonzero)
    # and their CSR form (16 per nonzero, plus the row pointer)
    parsed = _entry_dtype(header).itemsize + (16 if header.format == "array" else 0)
    require_host_memory(parsed * header.stored + 40 * header.entries + 8 * (header.rows + 1),
                        f"reading a {_count(header.rows)} x {_count(header.cols)} matrix with "
                        f"{_count(header.stored)} stored entr{'y' if header.stored == 1 else 'ies'}", path)
    with _reading(path), _open_text(path) as f:
        for _ in range(header.size_line):
            f.readline()
        try:
            with warnings.catch_warnings():  # blank lines and a cut file are reported here, not by NumPy
                warnings.filterwarnings("ignore", message="(Input line|loadtxt: input contained no data)",
                                        category=UserWarning)
                data = np.loadtxt(f, dtype=_entry_dtype(header), comments="%", max_rows=header.stored, ndmin=1)
        except ValueError as exc:
            raise _bad_entries(path, header, _first_line(exc)) from None
        trailing = next((line for line in f if line.split("%", 1)[0].strip()), None)
    if data.shape[0] < header.stored:
        raise InputError(f"truncated: {data.shape[0]:,} of the {header.stored:,} entries the header declares", path)
    if trailing is not None:
        raise _bad_entries(path, header, "data after the last entry")
    n, m = header.rows, header.cols
    if header.format == "array":
        values = data.astype(np.float64)
        if header.symmetry == "symmetric":
            cols, rows = np.triu_indices(n)  # the lower triangle, column by column
        else:
            cols, rows = np.divmod(np.arange(n * m, dtype=np.int64), n)
        keep = values != 0
        rows, cols, values = rows[keep], cols[keep], values[keep]
    else:
        rows, cols, values = data["row"] - 1, data["col"] - 1, data["value"].astype(np.float64)
        if rows.size and (rows.min() < 0 or rows.max() >= n or cols.min() < 0 or cols.max() >= m):
            raise _bad_entries(path, header, "an index outside the declared size")
    del data
    if header.symmetry == "symmetric":
        off = rows != cols
        rows, cols = np.concatenate([rows, cols[off]]), np.concatenate([cols, rows[off]])
        values = np.concatenate([values, values[off]])
    return sp.coo_matrix((values, (rows, cols)), shape=(n, m))


def read_matrix(path, dtype=np.float64, check_symmetric=True):
    """Read and validate a square, real, finite, symmetric sparse matrix.

    Parameters
    ----------
    path : str
        Matrix Market file (``coordinate`` or ``array``, ``real`` or
        ``integer``, ``general`` or ``symmetric``; gzip allowed).
    dtype : dtype
        Floating type of the returned matrix.
    check_symmetric : bool
        Reject matrices whose relative asymmetry exceeds :data:`SYMMETRY_RTOL`.

    Returns
    -------
    scipy.sparse.csr_matrix
    """
    path = os.fspath(path)
    header = read_header(path)
    rows, cols = header.rows, header.cols
    if rows != cols:
        raise InputError(f"matrix is not square ({rows} x {cols})", path)
    if rows == 0:
        raise InputError("matrix is empty (0 x 0)", path)
    A = read_entries(path, header).tocsr()
    A.sum_duplicates()
    A.eliminate_zeros()
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


def _read_array(path, n, block):
    """The numbers of a vector file (``.npy``, text or Matrix Market array), rows checked against ``n``.

    ``block``: the file holds ``n`` rows of one or more vectors (its first axis
    is checked); otherwise one vector of ``n`` entries (its size is checked).
    """
    what = "vectors" if block else "vector"
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError("no such file", path)
    if os.path.isdir(path):
        raise InputError(f"is a directory, not a {what} file", path)

    def check_rows(count):
        if n is not None and count != n:
            raise InputError(f"{what} {'have' if block else 'has'} {count} {'rows' if block else 'entries'} "
                             f"but the matrix has {n} rows", path)

    try:
        if path.endswith(".npy"):
            mapped = np.load(path, mmap_mode="r", allow_pickle=False)  # the header, without the data
            check_rows(mapped.shape[0] if block and mapped.ndim else mapped.size)
            v = np.array(mapped)
        elif path.endswith((".txt", ".dat", ".csv")):
            v = np.loadtxt(path, delimiter="," if path.endswith(".csv") else None, ndmin=2 if block else 1)
        else:
            header = read_header(path)
            check_rows(header.rows if block else header.rows * header.cols)
            v = read_entries(path, header).toarray()
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"cannot read {what} ({_first_line(exc)})", path) from None
    if np.iscomplexobj(v):
        raise InputError("complex vectors are not supported", path)
    return v


def _as_finite(v, dtype, what, path):
    """``v`` as ``dtype``, or InputError naming ``what`` (a vector, vectors) when not numeric or not finite."""
    try:
        v = v.astype(dtype)
    except (TypeError, ValueError) as exc:
        raise InputError(f"non-numeric {what} ({_first_line(exc)})", path) from None
    if not np.all(np.isfinite(v)):
        raise InputError(f"{what} {'have' if what == 'vectors' else 'has'} NaN or Inf entries", path)
    return v


def read_vector(path, n=None, dtype=np.float64):
    """Read a vector from ``.npy``, ``.txt`` or a Matrix Market array / n x 1 matrix.

    Parameters
    ----------
    n : int, optional
        Expected length; a mismatch raises :class:`InputError`.
    """
    v = _read_array(path, n, block=False)
    if v.ndim == 2 and 1 in v.shape:
        v = v.reshape(-1)
    if v.ndim != 1:
        raise InputError(f"expected a vector, got an array of shape {v.shape}", path)
    if n is not None and v.shape[0] != n:
        raise InputError(f"vector has {v.shape[0]} entries but the matrix has {n} rows", path)
    return _as_finite(v, dtype, "vector", path)


def read_vectors(path, n=None, dtype=np.float64):
    """Read ``k`` vectors of ``n`` entries as an ``(n, k)`` array (``.npy``, text columns or Matrix Market array).

    A file of one vector gives ``(n, 1)``. Used for an AMG near-nullspace.
    """
    v = _read_array(path, n, block=True)
    if v.ndim == 1:
        v = v[:, None]
    if v.ndim != 2:
        raise InputError(f"expected an (n, k) array of vectors, got shape {v.shape}", path)
    if n is not None and v.shape[0] != n:
        raise InputError(f"vectors have {v.shape[0]} rows but the matrix has {n} rows", path)
    return _as_finite(v, dtype, "vectors", path)


def read_columns(path, n, dtype=np.float64):
    """Read right-hand sides: one vector of ``n`` entries as ``(n,)``, or k > 1 as an ``(n, k)`` array.

    ``.npy``, a Matrix Market array of n rows and k columns, or text of n lines of k numbers;
    one row or one column of numbers is one vector, as :func:`read_vector` reads it.
    """
    v = _read_array(path, None, block=True)
    if v.ndim == 2 and 1 in v.shape:
        v = v.reshape(-1)
    if v.ndim == 1:
        if v.size != n:
            raise InputError(f"vector has {v.size} entries but the matrix has {n} rows", path)
        return _as_finite(v, dtype, "vector", path)
    if v.ndim != 2 or v.shape[0] != n:
        raise InputError(f"expected a vector or an (n, k) array of n = {n} rows, got shape {v.shape}", path)
    return _as_finite(v, dtype, "vectors", path)


def vector_format(path):
    """The format :func:`write_vector` uses for ``path``, from its suffix; InputError for others."""
    name = os.fspath(path).lower()
    for suffix in VECTOR_FORMATS:
        if name.endswith(suffix) and len(name) > len(suffix):
            return suffix
    raise InputError(f"unknown output format: the name must end in {', '.join(VECTOR_FORMATS[1:])} or "
                     f"{VECTOR_FORMATS[0]}", path)


def check_vector_output(path, what="solution"):
    """Raise :class:`InputError` now when :func:`write_vector` could not write ``path`` later."""
    vector_format(path)
    check_target(path, what)


def write_vector(path, x, what="solution"):
    """Write ``x`` to exactly ``path``, in the format its suffix names, atomically.

    ``.npy`` (NumPy), ``.mtx`` (Matrix Market ``array``), ``.mtx.gz`` (the
    same, gzipped) or ``.txt`` (one value per line; for an ``(n, k)`` array of k
    vectors, one row of k values per line). The previous file at
    ``path`` is replaced only once the new one is complete.
    """
    fmt = vector_format(path)
    x = np.asarray(x)
    x = x if x.ndim == 2 and 1 not in x.shape else x.reshape(-1)  # k columns stay an (n, k) array
    if fmt == ".npy":
        with AtomicFile(path, what) as f:
            np.save(f, x, allow_pickle=False)
        return
    digits = "%.9g" if x.dtype.itemsize <= 4 else "%.17g"  # enough to read back the same value
    rows, cols = x.shape if x.ndim == 2 else (x.size, 1)
    with AtomicFile(path, what, text=True, compress=fmt == ".mtx.gz") as f:
        if fmt != ".txt":
            f.write(f"%%MatrixMarket matrix array real general\n% {what} written by graphsolve-cuda\n{rows} {cols}\n")
            x = x.reshape(-1, order="F")  # an array's entries column after column
        np.savetxt(f, x, fmt=digits)  # text: a line a row
