"""Nothing lost, nothing misread: output files, signals, strict input, honest results (PCG).

Each case is one a hostile user tried: a full disk while writing, a device
node as the output, a signal in the middle of a write, garbled numbers in a
Matrix Market file, a header declaring a matrix larger than memory, a system
scaled by 1e-300, float32 asked for more than it can give, complex input.
"""
import gzip
import json
import os
import stat

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
import scipy.sparse.linalg as spla

import solvers
from solvers import resources
from solvers.errors import InputError
from solvers.gallery import poisson
from solvers.mmio import read_matrix, read_vector, write_vector
from solvers.outfiles import AtomicFile, check_target
from solvers.pcg import Reason
from solvers.pcg.__main__ import main

from contract import EXAMPLE, REPO, assert_one_line_error, leftovers, run_python


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# -- output files --------------------------------------------------------------------------------
def test_atomic_file_replaces_only_when_complete(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("previous")
    with pytest.raises(RuntimeError):
        with AtomicFile(target, "test output", text=True) as f:
            f.write("half of the new content")
            raise RuntimeError("the writer failed part-way")
    assert target.read_text() == "previous" and leftovers(tmp_path) == []
    with AtomicFile(target, "test output", text=True) as f:
        f.write("new")
    assert target.read_text() == "new" and leftovers(tmp_path) == []


def test_atomic_file_keeps_the_mode_and_writes_through_a_link(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    with AtomicFile(link, "test output", text=True) as f:
        f.write("new")
    assert link.is_symlink() and real.read_text() == "new"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_non_regular_targets_are_refused(tmp_path, kind):
    path = tmp_path / kind
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(InputError, match="only regular files are replaced") as info:
        check_target(path, "solution")
    assert str(path) in str(info.value)
    assert (stat.S_ISFIFO if kind == "fifo" else stat.S_ISDIR)(os.stat(path).st_mode)


def test_device_node_is_never_replaced(tmp_path):
    # /dev/null is a character device anywhere; it is refused before anything is written.
    with pytest.raises(InputError, match="/dev/null: is not a regular file"):
        check_target("/dev/null", "restart file")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("name", ["x.mtx", "x.mtx.gz", "x.npy", "sol.txt"])
def test_solution_written_to_the_exact_path_in_its_suffix_format(capsys, tmp_path, name):
    out = tmp_path / name
    code, _, _ = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu", "-q", "--output", out)
    assert code == 0 and sorted(p.name for p in tmp_path.iterdir()) == [name]
    if name.endswith(".npy"):
        x = np.load(out)
    elif name.endswith(".txt"):
        x = np.loadtxt(out)
    elif name.endswith(".gz"):
        with gzip.open(out, "rb") as f:
            x = scipy.io.mmread(f).ravel()
    else:
        x = scipy.io.mmread(str(out)).ravel()
    assert x.shape == (10_000,)
    np.testing.assert_allclose(x, 1.0, rtol=1e-6)


@pytest.mark.parametrize("option, value, needle", [
    ("--output", "x.dat", "unknown output format"),
    ("--output", "x", "unknown output format"),
    ("--plot", "h.notanimage", "unknown image format"),
    ("--json", "missing-dir/r.json", "does not exist"),
    ("--output", "missing-dir/x.npy", "does not exist"),
])
def test_unwritable_outputs_are_refused_before_solving(capsys, tmp_path, option, value, needle):
    pytest.importorskip("matplotlib")
    code, out, err = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu", option, tmp_path / value)
    assert code == 2 and out == ""  # no report: nothing was solved
    assert_one_line_error(err, tmp_path / value, needle)


@pytest.mark.parametrize("option, name", [("--output", "x.mtx"), ("--output", "x.npy"), ("--output", "x.mtx.gz"),
                                          ("--output", "x.txt"), ("--json", "r.json")])
def test_full_disk_keeps_the_previous_file(tmp_path, option, name):
    target = tmp_path / name
    target.write_bytes(b"previous content")
    # every one of these files is larger than the 4 kB the process may write
    proc = run_python(["-m", "solvers.pcg", "--matrix", EXAMPLE, "--device", "cpu", "-q", option, target],
                      cwd=tmp_path, file_size_limit=4000)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, target, "cannot write")
    assert target.read_bytes() == b"previous content" and leftovers(tmp_path) == []


# A CLI run whose writer is cut in half by a signal it sends itself: deterministic timing.
SIGNAL_DURING_WRITE = """
import os, signal, sys
import numpy as np
real_savetxt = np.savetxt
def savetxt(f, x, **kw):
    real_savetxt(f, x[: len(x) // 2], **kw)
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    real_savetxt(f, x[len(x) // 2:], **kw)
np.savetxt = savetxt
from solvers.pcg.__main__ import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("signame, code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_signal_while_writing_leaves_the_previous_file(tmp_path, signame, code):
    target = tmp_path / "x.mtx"
    target.write_text("previous solution")
    proc = run_python(["-c", SIGNAL_DURING_WRITE, signame, "--matrix", EXAMPLE, "--device", "cpu", "-q",
                       "--output", target], cwd=tmp_path)
    assert proc.returncode == code
    assert_one_line_error(proc.stderr, f"interrupted by {signame}")
    assert target.read_text() == "previous solution" and leftovers(tmp_path) == []


SIGNAL_DURING_SOLVE = """
import os, signal, sys
import solvers.pcg.cpu as cpu
real = cpu.pcg_single_reduction
def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kwargs)
cpu.pcg_single_reduction = interrupted
from solvers.pcg.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", [
    ["-m", "solvers.md", "--cells", "3", "3", "3", "--steps", "400", "--thermo", "1", "--device", "cpu"],
    ["-m", "solvers.pcg", "--matrix", EXAMPLE, "--device", "cpu", "--verbose"],
])
def test_output_closed_by_its_reader_ends_quietly(tmp_path, command):
    # `python -m solvers.md ... | head -1`: the reader leaves after one line
    import subprocess
    import sys
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, *map(str, command)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) in (0, 141) and "Traceback" not in err and "Error" not in err, err


def test_ctrl_c_during_the_solve_is_one_line_and_exit_130(tmp_path):
    proc = run_python(["-c", SIGNAL_DURING_SOLVE, "--matrix", EXAMPLE, "--device", "cpu", "--variant",
                       "single-reduction", "--output", tmp_path / "x.npy"], cwd=tmp_path)
    assert proc.returncode == 130 and proc.stdout == ""
    assert_one_line_error(proc.stderr, "interrupted by SIGINT")
    assert list(tmp_path.iterdir()) == []


# -- strict Matrix Market input --------------------------------------------------------------------
HEADER = "%%MatrixMarket matrix coordinate real general\n2 2 2\n"


@pytest.mark.parametrize("line, needle", [
    ("1 1 2,50", "line 3: '2,50' is not a number"),
    ("1 1 2.0abc", "line 3: '2.0abc' is not a number"),
    ("1 1 1_000", "line 3: '1_000' is not a number"),
    ("1 1 2.5.5", "line 3: '2.5.5' is not a number"),
    ("1 1 0x1p1", "line 3: '0x1p1' is not a number"),
    ("1 1 2 7", "line 3: expected 3 fields (row column value), found 4"),
    ("1.0 1 2", "line 3: row index '1.0' is not an integer"),
    ("1 3 2", "line 3: column index 3 is outside 1..2"),
])
def test_garbled_entries_are_bad_input_naming_the_line(capsys, tmp_path, line, needle):
    path = write(tmp_path, "m.mtx", HEADER + line + "\n2 2 1\n")
    code, out, err = run_cli(capsys, "--matrix", path, "--device", "cpu")
    assert code == 2 and out == ""
    assert_one_line_error(err, path, needle)


def test_non_integer_in_an_integer_file(capsys, tmp_path):
    path = write(tmp_path, "i.mtx", "%%MatrixMarket matrix coordinate integer symmetric\n2 2 2\n1 1 2.5\n2 2 3\n")
    code, _, err = run_cli(capsys, "--matrix", path, "--device", "cpu")
    assert code == 2
    assert_one_line_error(err, path, "line 3: '2.5' is not an integer (the header says integer)")


def test_explicit_plus_sign_comments_and_blank_lines_are_valid(tmp_path):
    path = write(tmp_path, "ok.mtx", "%%MatrixMarket matrix coordinate real general\n% about\n\n2 2 2\n"
                 "% entries\n1 1 +2.0\n\n2 2 1E+00 % trailing note\n")
    np.testing.assert_array_equal(read_matrix(path).toarray(), [[2.0, 0.0], [0.0, 1.0]])


def test_entries_read_exactly_like_scipy_on_real_files(matrices_dir):
    for name in ("1138_bus.mtx", "gr_900_900_crg.mtx", "ginkgo_simple_A.mtx"):
        ours, theirs = read_matrix(matrices_dir / name), sp.csr_matrix(scipy.io.mmread(str(matrices_dir / name)))
        assert ours.nnz == theirs.nnz and abs(ours - theirs).max() == 0, name


def test_symmetric_array_file_is_the_lower_triangle_by_columns(tmp_path):
    path = write(tmp_path, "a.mtx", "%%MatrixMarket matrix array real symmetric\n3 3\n4\n-1\n0\n5\n-2\n6\n")
    np.testing.assert_array_equal(read_matrix(path).toarray(), [[4, -1, 0], [-1, 5, -2], [0, -2, 6]])


@pytest.mark.parametrize("size, needle", [
    ("0 0", "matrix is empty (0 x 0)"),
    ("0 5", "matrix is not square (0 x 5)"),
    ("9223372036854775807 9223372036854775807", "would need about"),
    ("2 2 2", "bad size line"),
])
def test_array_sizes_zero_and_huge(capsys, tmp_path, size, needle):
    path = write(tmp_path, "a.mtx", f"%%MatrixMarket matrix array real general\n{size}\n1\n")
    code, _, err = run_cli(capsys, "--matrix", path, "--device", "cpu")
    assert code == 2
    assert_one_line_error(err, path, needle)


def test_header_larger_than_memory_is_refused_before_reading(capsys, tmp_path):
    path = write(tmp_path, "big.mtx", "%%MatrixMarket matrix coordinate real general\n"
                 "1000000000000 1000000000000 1\n1 1 1\n")
    code, _, err = run_cli(capsys, "--matrix", path, "--device", "cpu")
    assert code == 2
    assert_one_line_error(err, path, "would need about", "TiB of memory, but only")


def test_memory_limit_of_the_process_is_respected(tmp_path):
    # 10^9 x 10^9 with one entry: the row pointer alone is 8 GB; the address-space limit is 3 GiB.
    path = write(tmp_path, "wide.mtx", "%%MatrixMarket matrix coordinate real general\n"
                 "1000000000 1000000000 1\n1 1 1\n")
    proc = run_python(["-c", "import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
                       "from solvers.pcg.__main__ import main\nsys.exit(main(sys.argv[1:]))",
                       "--matrix", path, "--device", "cpu"], cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, path, "would need about", "GiB of memory")


def test_available_memory_is_known_and_bounded_by_rlimit():
    import resource
    available = resources.available_host_memory()
    assert available is not None and available > 0
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    assert soft == resource.RLIM_INFINITY or available <= soft


def test_vector_file_declaring_a_wrong_length_is_refused_unread(tmp_path):
    path = tmp_path / "b.npy"
    np.save(path, np.ones(5))
    with pytest.raises(InputError, match="5 entries but the matrix has 3 rows"):
        read_vector(str(path), n=3)


def test_write_vector_refuses_unknown_suffix_and_writes_atomically(tmp_path):
    with pytest.raises(InputError, match="unknown output format"):
        write_vector(str(tmp_path / "x.csv"), np.ones(3))
    write_vector(str(tmp_path / "x.txt"), np.array([1.5, -2.0], dtype=np.float32))
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "x.txt"), [1.5, -2.0])


# -- honest results --------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e-300, 1e-200, 1e300])
def test_badly_scaled_matrix_is_solved_not_converged_in_0_iterations(capsys, tmp_path, scale):
    A = poisson((15, 15)).tocsr()
    path = tmp_path / "scaled.mtx"
    scipy.io.mmwrite(str(path), A * scale)
    code, out, _ = run_cli(capsys, "--matrix", path, "--device", "cpu", "--json", tmp_path / "r.json")
    rep = json.loads((tmp_path / "r.json").read_text())
    reference = solvers.PCG(A, rtol=1e-8, device="cpu").solve(A @ np.ones(A.shape[0]))
    assert code == 0 and rep["converged"] and rep["iterations"] == reference.iterations > 0
    assert rep["error_vs_exact"] < 1e-6 and rep["true_relative_residual"] < 2e-8


def test_scaling_is_exact_in_powers_of_two():
    A = poisson((12, 12)).tocsr()
    b = A @ np.linspace(1, 2, A.shape[0])
    history = []
    plain = solvers.PCG(A, rtol=1e-10, device="cpu", record_history=True).solve(b)
    scaled = solvers.PCG(A * 2.0 ** -1000, rtol=1e-10, device="cpu", record_history=True).solve(
        b * 2.0 ** -990, callback=lambda xk: history.append(xk.copy()))
    assert scaled.iterations == plain.iterations
    np.testing.assert_array_equal(scaled.x, plain.x * 2.0 ** 10)
    np.testing.assert_array_equal(history[-1], scaled.x)
    np.testing.assert_array_equal(scaled.history, plain.history * 2.0 ** -990)


def test_float32_outside_its_range_is_scaled_before_rounding():
    A = poisson((12, 12)).tocsr()
    for scale in (1e-50, 1e50):
        res = solvers.PCG(A * scale, rtol=1e-4, dtype="float32", device="cpu").solve(A @ np.ones(144) * scale)
        assert res.converged and res.iterations > 0 and np.abs(res.x - 1).max() < 1e-3


def test_float32_convergence_the_true_residual_does_not_support_is_not_reported(capsys):
    A = read_matrix(EXAMPLE)
    b = A @ np.ones(A.shape[0])
    res = solvers.PCG(A, rtol=1e-8, dtype="float32", device="cpu").solve(b)
    assert res.reason is Reason.INACCURATE and not res.converged and res.info == res.iterations
    assert res.true_residual_norm > 2 * res.tolerance
    assert solvers.PCG(A, rtol=1e-8, device="cpu").solve(b).converged  # float64 reaches it
    code, out, _ = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu", "--dtype", "float32")
    assert code == 1 and "NOT CONVERGED" in out and "true residual is above the tolerance" in out
    code, out, _ = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu", "--dtype", "float32", "--rtol", "1e-5")
    assert code == 0 and "converged in" in out


def test_new_values_of_a_reordered_matrix_are_reordered_too():
    A = (poisson((10, 12)) + sp.diags(np.linspace(0, 1, 120))).tocsr()
    b = np.linspace(1, 2, 120)
    solver = solvers.PCG(A, reorder="rcm", device="cpu", rtol=1e-12)
    first = solver.solve(b).x
    solver.update_values(2 * A)
    assert solver.reordering == "rcm"
    np.testing.assert_allclose(solver.solve(b).x, first / 2, rtol=1e-9)


def _hermitian():
    A = sp.diags([4.0 + 0j] * 5) + sp.diags([1j] * 4, 1) + sp.diags([-1j] * 4, -1)
    return A.tocsr()


@pytest.mark.parametrize("case", ["sparse", "dense", "operator", "rhs", "x0", "preconditioner"])
def test_complex_input_is_refused_everywhere(case):
    A, b, kwargs = sp.eye(5, format="csr"), np.ones(5), {}
    if case == "sparse":
        A = _hermitian()
    elif case == "dense":
        A = _hermitian().toarray()
    elif case == "operator":
        A = spla.aslinearoperator(_hermitian())
    elif case == "rhs":
        b = b + 1j
    elif case == "x0":
        kwargs["x0"] = np.ones(5) * 1j
    else:
        kwargs["M"] = spla.aslinearoperator(_hermitian())
    with pytest.raises(InputError, match="must be real.*complex"):
        solvers.cg(A, b, **kwargs)


def test_jacobi_error_names_the_matrix_file(capsys, tmp_path):
    path = write(tmp_path, "z.mtx", "%%MatrixMarket matrix coordinate real symmetric\n2 2 2\n2 1 1\n2 2 2\n")
    code, _, err = run_cli(capsys, "--matrix", path, "--device", "cpu")
    assert code == 2
    assert_one_line_error(err, path, "positive diagonal")


def test_float32_flush_to_zero_names_the_matrix_file(capsys, tmp_path):
    path = write(tmp_path, "wide.mtx", "%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1e30\n2 2 1e-30\n")
    code, _, err = run_cli(capsys, "--matrix", path, "--device", "cpu", "--dtype", "float32", "--precond", "none")
    assert code == 2
    assert_one_line_error(err, path, "too small to be held in float32")


@pytest.mark.parametrize("option, value", [("--rtol", "nan"), ("--atol", "inf"), ("--rtol", "-inf"),
                                           ("--atol", "NaN")])
def test_non_finite_options_are_bad_input(capsys, option, value):
    code, out, err = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu", f"{option}={value}")
    assert code == 2 and out == ""
    assert_one_line_error(err, option, "must be a finite number")


def test_library_refuses_non_finite_tolerances():
    for kwargs in ({"rtol": float("nan")}, {"atol": float("inf")}, {"maxiter": 2.5}):
        with pytest.raises(InputError):
            solvers.PCG(sp.eye(3), device="cpu", **kwargs)


def test_timeout_is_for_distributed_runs(capsys):
    code, _, err = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu", "--timeout", "5")
    assert code == 2
    assert_one_line_error(err, "--timeout", "MPI launcher")


class _ForeignDtype:
    """A dtype object NumPy cannot interpret, as another array library's (``torch.float64``)."""

    def __init__(self, name, is_complex):
        self.name, self.is_complex = name, is_complex

    def __str__(self):
        return f"foreign.{self.name}"


class _ForeignArray:
    def __init__(self, name, is_complex):
        self.dtype = _ForeignDtype(name, is_complex)


def test_complex_check_reads_other_libraries_dtypes():
    from solvers.pcg.solver import refuse_complex
    refuse_complex(_ForeignArray("float64", False), "b")  # real: accepted without asking NumPy
    with pytest.raises(InputError, match="b must be real, got dtype foreign.complex128"):
        refuse_complex(_ForeignArray("complex128", True), "b")


def test_a_benchmark_run_saves_its_results_whole_under_one_stamp(tmp_path, monkeypatch):
    """The bench and probe scripts rewrite their table after each problem: one file a run (the run's start in
    its name, to the second, so two runs do not overwrite each other), written whole, never a directory replaced."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import provenance
    first = provenance.stamp()
    path = provenance.save(tmp_path / "results", f"pcg_{first}.md", "| a |\n")
    provenance.save(tmp_path / "results", f"pcg_{provenance.stamp()}.md", "| a |\n| b |\n")
    assert provenance.stamp() == first and len(first) == len("2026-12-02_184812")
    assert [p.name for p in (tmp_path / "results").iterdir()] == [path.name] and leftovers(tmp_path / "results") == []
    assert path.read_text() == "| a |\n| b |\n"
    (tmp_path / "results" / "table.md").mkdir()
    with pytest.raises(InputError, match="is a directory"):
        provenance.save(tmp_path / "results", "table.md", "x")
