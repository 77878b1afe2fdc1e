"""Property-based fuzzing (hypothesis) of the bad-input contract.

Malformed Matrix Market files (cut, bytes flipped, numbers garbled, headers
changed), damaged MD restart files, non-finite options, outputs written to a
disk that fills at a random byte, and option mismatches between MPI ranks.
Every example must end in a result or in the contract of ``contract.py``
(exit code 2, one line naming the file or option, no traceback, previous
files intact); a matrix that is accepted must be exactly the one the file
describes (an independent strict reading below). Examples are derandomised so
that CI runs are repeatable; the number of examples keeps the suite to
seconds (run with ``--hypothesis-seed=random`` to explore further).
"""
import contextlib
import io
import json
import os
import re
import tempfile

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402

from solvers.errors import InputError  # noqa: E402
from solvers.mmio import read_matrix  # noqa: E402

from contract import EXAMPLE, SMALL_SPD, assert_one_line_error, leftovers, run_python  # noqa: E402
from fuzzing import fuzz  # noqa: E402


def call_cli(main, argv):
    """Run a CLI ``main`` in this process; ``(code, stdout, stderr)``."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


# -- Matrix Market ----------------------------------------------------------------------------------
BASES = [
    SMALL_SPD,
    "%%MatrixMarket matrix coordinate integer general\n% comment\n3 3 3\n1 1 4\n2 2 5\n3 3 6\n",
    "%%MatrixMarket matrix array real symmetric\n2 2\n4.0\n-1.0e+00\n4.0\n",
    "%%MatrixMarket matrix coordinate real general\n2 2 3\n1 1 2.5\n2 1 -0.5\n2 2 3.25\n",
]
GARBLED = ["2,50", "2.0abc", "1_000", "2.5.5", "0x1p1", "+2.0", "-0", ".5", "5.", "1e", "e5", "+-1", "1e5.5",
           "nan", "inf", "-Infinity", "1e400", "1e-400", "١", "２", "1\u00a0", "", "%", "1 2", "++1", "0.0", "1d5"]


@st.composite
def matrix_files(draw):
    text = draw(st.sampled_from(BASES))
    data = bytearray(text.encode())
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["cut", "flip", "garble", "extra", "header", "line"]))
        if kind == "cut" and data:
            del data[draw(st.integers(0, len(data) - 1)):]
        elif kind == "flip" and data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        elif kind in ("garble", "extra"):
            lines = data.decode("latin-1").split("\n")
            k = draw(st.integers(0, max(len(lines) - 1, 0)))
            tokens = lines[k].split(" ")
            word = draw(st.sampled_from(GARBLED) | st.text(alphabet="0123456789+-.eE_,x ", max_size=5))
            if kind == "extra":
                tokens.append(word)
            else:
                tokens[draw(st.integers(0, len(tokens) - 1))] = word
            lines[k] = " ".join(tokens)
            data = bytearray("\n".join(lines).encode("latin-1", "replace"))
        elif kind == "header":
            lines = data.decode("latin-1").split("\n")
            words = lines[0].split(" ")
            words[draw(st.integers(0, len(words) - 1))] = draw(st.sampled_from(
                ["%%MatrixMarket", "matrix", "vector", "coordinate", "array", "real", "integer", "complex",
                 "pattern", "double", "general", "symmetric", "skew-symmetric", "hermitian", "Real", "x"]))
            lines[0] = " ".join(words)
            data = bytearray("\n".join(lines).encode("latin-1"))
        elif kind == "line":
            lines = data.decode("latin-1").split("\n")
            lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(
                ["", "% note", "1 1 1", "3 3 3", "2 1 -1", "1 1", "x"])))
            data = bytearray("\n".join(lines).encode("latin-1"))
    return bytes(data)


_INT = re.compile(r"[+-]?[0-9]+")
_REAL = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan)", re.IGNORECASE)


def strict_reading(raw):
    """The matrix a Matrix Market file describes, as ``(shape, {(i, j): value})``, or None if malformed.

    Written from the format's definition, independently of the reader under test.
    """
    lines = re.split(r"\r\n|\r|\n", raw.decode("latin-1"))
    banner = lines[0].split()
    if len(banner) != 5 or banner[0] != "%%MatrixMarket":
        return None
    obj, fmt, field, symmetry = (w.lower() for w in banner[1:])
    field = "real" if field == "double" else field
    if obj != "matrix" or fmt not in ("coordinate", "array") or field not in ("real", "integer") \
            or symmetry not in ("general", "symmetric"):
        return None
    k = 1
    while k < len(lines) and (not lines[k].strip() or lines[k].strip().startswith("%")):
        k += 1
    if k == len(lines):
        return None
    size = lines[k].split()
    if len(size) != (3 if fmt == "coordinate" else 2) or not all(_INT.fullmatch(t) for t in size):
        return None
    rows, cols = int(size[0]), int(size[1])
    if rows < 0 or cols < 0 or (fmt == "array" and symmetry == "symmetric" and rows != cols):
        return None
    if fmt == "coordinate":
        stored = int(size[2])
        if stored < 0:
            return None
    else:
        stored = rows * (rows + 1) // 2 if symmetry == "symmetric" else rows * cols
    number = _INT if field == "integer" else _REAL
    entries = []
    for line in lines[k + 1:]:
        tokens = line.split("%", 1)[0].split()
        if not tokens:
            continue
        if len(entries) == stored or len(tokens) != (3 if fmt == "coordinate" else 1):
            return None
        if not number.fullmatch(tokens[-1]):
            return None
        value = float(int(tokens[-1])) if field == "integer" else float(tokens[-1])
        if fmt == "coordinate":
            if not (_INT.fullmatch(tokens[0]) and _INT.fullmatch(tokens[1])):
                return None
            i, j = int(tokens[0]) - 1, int(tokens[1]) - 1
            if not (0 <= i < rows and 0 <= j < cols):
                return None
            entries.append((i, j, value))
        else:
            entries.append((None, None, value))
    if len(entries) != stored:
        return None
    if fmt == "array":
        positions = ([(i, j) for j in range(cols) for i in range(j, rows)] if symmetry == "symmetric"
                     else [(i, j) for j in range(cols) for i in range(rows)])
        entries = [(i, j, v) for (i, j), (_, _, v) in zip(positions, entries)]
    matrix = {}
    for i, j, v in entries:
        pairs = [(i, j), (j, i)] if symmetry == "symmetric" and i != j else [(i, j)]
        for p in pairs:
            matrix[p] = matrix.get(p, 0.0) + v
    return (rows, cols), {p: v for p, v in matrix.items() if v != 0}


@fuzz(250)
@given(raw=matrix_files())
def test_matrix_market_fuzz(raw):
    from solvers.pcg.__main__ import main
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fuzzed.mtx")
        with open(path, "wb") as f:
            f.write(raw)
        code, out, err = call_cli(main, ["--matrix", path, "--device", "cpu", "-q", "--maxiter", "50"])
        assert code in (0, 1, 2), err
        if code == 2:
            assert out == ""
            assert_one_line_error(err, path)
        else:
            assert err == "" and "fuzzed.mtx" in out
        try:
            A = read_matrix(path, check_symmetric=False)
        except InputError as exc:
            assert str(exc).startswith(path) and "\n" not in str(exc)
            return
        expected = strict_reading(raw)
        assert expected is not None, "a malformed file was accepted"
        shape, entries = expected
        coo = A.tocoo()
        assert A.shape == shape
        assert {(int(i), int(j)): float(v) for i, j, v in zip(coo.row, coo.col, coo.data)} == entries


# -- restart files ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def restart_file(tmp_path_factory):
    from solvers.md.__main__ import main
    path = tmp_path_factory.mktemp("restart") / "base.npz"
    code, _, err = call_cli(main, ["--cells", "3", "3", "3", "--device", "cpu", "--steps", "3", "--thermostat",
                                   "langevin", "--restart", path])
    assert code == 0, err
    return path.read_bytes()


ODD_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 2 ** 65), st.text(max_size=4),
                       st.floats(allow_nan=True, allow_infinity=True), st.lists(st.integers(), max_size=2))


@st.composite
def damaged_restarts(draw, base):
    kind = draw(st.sampled_from(["cut", "flip", "meta", "drop", "reshape", "retype"]))
    if kind == "cut":
        return base[:draw(st.integers(0, len(base) - 1))]
    if kind == "flip":
        data = bytearray(base)
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    with np.load(io.BytesIO(base)) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["meta"]))
    if kind == "meta":
        key = draw(st.sampled_from(sorted(meta) + ["extra"]))
        meta[key] = draw(ODD_VALUES)
        arrays["meta"] = np.array(json.dumps(meta))
    elif kind == "drop":
        del arrays[draw(st.sampled_from(sorted(arrays)))]
    elif kind == "reshape":
        key = draw(st.sampled_from(sorted(k for k in arrays if k != "meta")))
        a = arrays[key].reshape(-1)
        arrays[key] = a[:draw(st.integers(0, a.size))]
    else:
        key = draw(st.sampled_from(sorted(k for k in arrays if k != "meta")))
        arrays[key] = arrays[key].astype(draw(st.sampled_from([np.float32, np.int32, np.uint8, np.bool_])))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


@fuzz(60)
@given(data=st.data())
def test_restart_fuzz(restart_file, data):
    from solvers.md import Simulation, UnstableRunError
    from solvers.md.io import read_restart
    raw = data.draw(damaged_restarts(restart_file))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fuzzed.npz")
        with open(path, "wb") as f:
            f.write(raw)
        try:
            state, arrays, meta = read_restart(path)
        except InputError as exc:
            assert str(exc).startswith(path) and "\n" not in str(exc)
            return
        assert state.n == len(arrays["positions"]) and np.isfinite(state.positions).all()
        try:
            Simulation.from_restart(path, device="cpu").run(1)
        except InputError as exc:
            assert "\n" not in str(exc)
        except UnstableRunError:
            pass


# -- non-finite options -----------------------------------------------------------------------------
FLOAT_OPTIONS = [("pcg", "--rtol"), ("pcg", "--atol"), ("md", "--dt"), ("md", "--skin"), ("md", "--rc"),
                 ("md", "--temp"), ("md", "--density"), ("md", "--t-target"), ("md", "--damp")]
NON_FINITE = ["nan", "NaN", "inf", "-inf", "+inf", "Infinity", "-Infinity", "1e999", "-1e999"]


@fuzz(40)
@given(option=st.sampled_from(FLOAT_OPTIONS), value=st.sampled_from(NON_FINITE))
def test_non_finite_option_fuzz(option, value):
    tool, name = option
    if tool == "pcg":
        from solvers.pcg.__main__ import main
        argv = ["--matrix", EXAMPLE, "--device", "cpu"]
    else:
        from solvers.md.__main__ import main
        argv = ["--cells", "2", "2", "2", "--device", "cpu", "--steps", "1", "--thermostat", "langevin"]
    code, out, err = call_cli(main, [*argv, f"{name}={value}"])
    assert code == 2 and out == ""
    assert_one_line_error(err, name, "must be a finite number")


# -- outputs on a disk that fills up ----------------------------------------------------------------
OUTPUTS = [
    ("pcg", "--output", "x.mtx"), ("pcg", "--output", "x.mtx.gz"), ("pcg", "--output", "x.npy"),
    ("pcg", "--output", "x.txt"), ("pcg", "--json", "r.json"),
    ("md", "--dump", "t.xyz"), ("md", "--dump", "t.dump.gz"), ("md", "--restart", "r.npz"),
]


def _output_command(tool, option, target):
    if tool == "pcg":  # --json records the history: the report is the same bytes in every run but times
        return ["-m", "solvers.pcg", "--matrix", EXAMPLE, "--device", "cpu", "-q", option, target]
    return ["-m", "solvers.md", "--cells", "3", "3", "3", "--device", "cpu", "--steps", "10", "--dump-every", "5",
            option, target]


# Outputs whose bytes are the same in every run (a JSON report holds timings, an .npz archive dates).
REPEATABLE = (".mtx", ".npy", ".txt", ".mtx.gz", ".xyz", ".dump.gz")


@pytest.fixture(scope="module")
def complete_outputs(tmp_path_factory):
    """Each output written without a limit, to compare with."""
    folder = tmp_path_factory.mktemp("complete")
    for tool, option, name in OUTPUTS:
        proc = run_python(_output_command(tool, option, folder / name), cwd=folder)
        assert proc.returncode == 0, proc.stderr
    return folder


def _is_complete(path, reference):
    if path.endswith(REPEATABLE):
        with open(path, "rb") as f, open(reference, "rb") as g:
            return f.read() == g.read()
    if path.endswith(".json"):
        with open(path) as f:
            return json.load(f)["converged"] is True
    from solvers.md.io import read_restart
    return read_restart(path)[0].n == 108


@fuzz(12)
@given(output=st.sampled_from(OUTPUTS), fraction=st.floats(0.0, 1.3))
def test_full_disk_fuzz(complete_outputs, output, fraction):
    tool, option, name = output
    size = (complete_outputs / name).stat().st_size
    limit = int(size * fraction)
    with tempfile.TemporaryDirectory() as tmp:
        target = os.path.join(tmp, name)
        with open(target, "wb") as f:
            f.write(b"previous run")
        proc = run_python(_output_command(tool, option, target), cwd=tmp, file_size_limit=limit)
        assert leftovers(tmp) == []
        if proc.returncode == 0:
            assert _is_complete(target, complete_outputs / name)
        else:
            assert proc.returncode == 2
            assert_one_line_error(proc.stderr, target, "cannot write")
            with open(target, "rb") as f:
                assert f.read() == b"previous run"
            assert not (name.endswith(REPEATABLE) and limit >= size), "a write that fits failed"


# -- MPI ranks that disagree ------------------------------------------------------------------------
CHOICES = {"--variant": ["classic", "single-reduction"], "--maxiter": ["5", "7", "1000"],
           "--rtol": ["1e-8", "1e-6"], "--dtype": ["float64", "float32"], "--precond": ["jacobi", "none"],
           "--unroll": ["8", "32"], "--atol": ["0", "1e-12"]}


@pytest.mark.mpi
@fuzz(4)
@given(data=st.data())
def test_rank_disagreement_fuzz(data):
    from test_dist_agreement import run_ranks
    option = data.draw(st.sampled_from(sorted(CHOICES)))
    mine, theirs = data.draw(st.permutations(CHOICES[option]))[:2]
    base = ["--matrix", EXAMPLE, "--device", "cpu"]
    proc = run_ranks([*base, option, mine], [*base, option, theirs], timeout=60)
    assert proc.returncode == 2 and proc.seconds < 30
    assert_one_line_error(proc.stderr, "rank 1: options differ from rank 0's", option)

