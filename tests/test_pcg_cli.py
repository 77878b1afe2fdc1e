"""The ``python -m solvers.pcg`` command line: reports, files and every bad input."""
import io
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import scipy.io

import solvers
from solvers.pcg.__main__ import build_parser, main
from solvers.pcg.progress import ResidualProgress

EXAMPLE = str(pathlib.Path(__file__).resolve().parent.parent / "examples" / "data" / "lap2D_5pt_n100.mtx")


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real symmetric\n3 3 5\n1 1 4\n2 1 -1\n2 2 4\n3 2 -1\n3 3 4\n")
    return path


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_report_on_bundled_example(capsys):
    code, out, err = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu")
    assert code == 0
    assert "converged in" in out and "n = 10,000" in out and "true relative residual" in out
    assert "error vs exact solution" in out and "us per iteration" in out


def test_variant_option_selects_single_reduction(capsys, tmp_path):
    out_json = tmp_path / "r.json"
    code, out, _ = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu", "--variant", "single-reduction",
                           "--json", out_json)
    rep = json.loads(out_json.read_text())
    assert code == 0 and "single-reduction PCG" in out
    assert rep["variant"] == "single-reduction" and rep["converged"]


def test_outputs_json_solution_and_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    js, sol, png = tmp_path / "r.json", tmp_path / "x.npy", tmp_path / "h.png"
    code, out, _ = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu", "--json", js, "--output", sol, "--plot", png)
    assert code == 0
    rep = json.loads(js.read_text())
    assert rep["converged"] and rep["iterations"] == len(rep["history"]) - 1
    np.testing.assert_allclose(np.load(sol), 1.0, rtol=1e-5)
    assert png.stat().st_size > 1000


def test_rhs_x0_and_mtx_output(capsys, tmp_path, small):
    rhs = tmp_path / "b.npy"
    np.save(rhs, np.array([1.0, 2.0, 3.0]))
    x0 = tmp_path / "x0.txt"
    x0.write_text("0.1\n0.2\n0.3\n")
    out_path = tmp_path / "x.mtx"
    code, out, _ = run_cli(capsys, "--matrix", small, "--rhs", rhs, "--x0", x0, "--output", out_path, "--rtol", "1e-12")
    assert code == 0 and "error vs exact" not in out
    x = scipy.io.mmread(str(out_path)).ravel()
    A = scipy.io.mmread(str(small)).toarray()
    np.testing.assert_allclose(A @ x, [1.0, 2.0, 3.0], rtol=1e-10)


def test_not_converged_exits_one(capsys):
    code, out, _ = run_cli(capsys, "--matrix", EXAMPLE, "--maxiter", "3", "--device", "cpu")
    assert code == 1 and "NOT CONVERGED" in out and "max iterations" in out


def test_indefinite_matrix_exits_one_with_breakdown(capsys, tmp_path):
    path = write(tmp_path, "indef.mtx", "%%MatrixMarket matrix coordinate real general\n3 3 3\n1 1 1\n2 2 -2\n3 3 3\n")
    code, out, _ = run_cli(capsys, "--matrix", path, "--precond", "none")
    assert code == 1 and "breakdown" in out and "converged in" not in out.replace("NOT CONVERGED", "")


def test_quiet_prints_one_line(capsys):
    code, out, _ = run_cli(capsys, "--matrix", EXAMPLE, "-q", "--device", "cpu")
    assert code == 0 and len(out.strip().splitlines()) == 1


def test_graph_mode_without_gpu_is_clear_error(capsys, monkeypatch):
    monkeypatch.setenv("GRAPHSOLVE_DISABLE_GPU", "1")
    from solvers import backend
    backend._probe_gpu.cache_clear()
    try:
        code, out, err = run_cli(capsys, "--matrix", EXAMPLE, "--mode", "while")
    finally:
        backend._probe_gpu.cache_clear()
    assert code == 2 and "needs a GPU" in err and len(err.strip().splitlines()) == 1


BAD_INPUTS = {
    "missing": (None, "no such file"),
    "empty": ("", "empty file"),
    "bad header": ("%%MatrixMarketX matrix coordinate real general\n2 2 1\n1 1 1\n", "header"),
    "truncated": ("%%MatrixMarket matrix coordinate real general\n3 3 3\n1 1 1\n", "runcated"),
    "non-numeric": ("%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 abc\n2 2 1\n",
                    "line 3: 'abc' is not a number"),
    "complex": ("%%MatrixMarket matrix coordinate complex general\n2 2 2\n1 1 1 0\n2 2 1 0\n", "complex"),
    "pattern": ("%%MatrixMarket matrix coordinate pattern general\n2 2 2\n1 1\n2 2\n", "pattern"),
    "non-square": ("%%MatrixMarket matrix coordinate real general\n2 3 2\n1 1 1\n2 2 1\n", "not square"),
    "nan": ("%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 nan\n2 2 1\n", "NaN or Inf"),
    "inf": ("%%MatrixMarket matrix array real general\n2 2\n1\n0\n0\ninf\n", "NaN or Inf"),
    "asymmetric": ("%%MatrixMarket matrix coordinate real general\n2 2 3\n1 1 2\n1 2 1\n2 2 2\n", "not symmetric"),
    "zero size": ("%%MatrixMarket matrix coordinate real general\n0 0 0\n", "empty"),
    "no entries": ("%%MatrixMarket matrix coordinate real general\n2 2 0\n", "no nonzero"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_matrix_is_one_line_error_exit_two(capsys, tmp_path, case):
    text, needle = BAD_INPUTS[case]
    path = tmp_path / "m.mtx"
    if text is not None:
        path.write_text(text)
    code, out, err = run_cli(capsys, "--matrix", path, "--device", "cpu")
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and str(path) in err and needle in err
    assert "Traceback" not in err and out == ""


def test_rounding_level_asymmetry_is_accepted(capsys, tmp_path):
    path = write(tmp_path, "g.mtx", "%%MatrixMarket matrix coordinate real general\n2 2 4\n"
                 "1 1 4\n1 2 -1.0000000000000002\n2 1 -1\n2 2 4\n")
    code, out, _ = run_cli(capsys, "--matrix", path, "--device", "cpu")
    assert code == 0


def test_integer_array_and_gzip_matrices(capsys, tmp_path, matrices_dir):
    arr = write(tmp_path, "a.mtx", "%%MatrixMarket matrix array integer symmetric\n2 2\n4\n-1\n4\n")
    assert run_cli(capsys, "--matrix", arr)[0] == 0
    import gzip
    gz = tmp_path / "g.mtx.gz"
    with open(matrices_dir / "gr_900_900_crg.mtx", "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert run_cli(capsys, "--matrix", gz, "--device", "cpu")[0] == 0


@pytest.mark.parametrize("rhs_text,needle", [
    ("1\n2\n", "2 entries but the matrix has 3 rows"),
    ("1\nnan\n3\n", "NaN or Inf"),
    ("1\nx\n3\n", "cannot read vector"),
])
def test_bad_rhs(capsys, tmp_path, small, rhs_text, needle):
    rhs = write(tmp_path, "b.txt", rhs_text)
    code, out, err = run_cli(capsys, "--matrix", small, "--rhs", rhs)
    assert code == 2 and needle in err and rhs in err


def test_jacobi_with_zero_diagonal_is_input_error(capsys, tmp_path):
    path = write(tmp_path, "z.mtx", "%%MatrixMarket matrix coordinate real symmetric\n2 2 2\n2 1 1\n2 2 2\n")
    code, _, err = run_cli(capsys, "--matrix", path)
    assert code == 2 and "positive diagonal" in err


def test_unwritable_output_is_reported(capsys, tmp_path):
    code, _, err = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu", "--output", tmp_path / "no" / "x.npy")
    assert code == 2 and "cannot write solution" in err


def test_module_entry_point_runs_bundled_example_from_any_directory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "solvers.pcg", "--example", "lap2D_5pt_n100", "-q", "--device", "cpu"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("lap2D_5pt_n100.mtx: converged, 183 iterations")


def test_unknown_example_is_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--example", "nonesuch"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "unknown example matrix 'nonesuch'" in err and "lap2D_5pt_n100" in err


def test_matrix_and_example_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--matrix", EXAMPLE, "--example", "lap2D_5pt_n100"])
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"python -m solvers.pcg ({solvers.DISTRIBUTION} {solvers.__version__})"


def test_every_option_has_help():
    undocumented = [a.option_strings for a in build_parser()._actions if not a.help or a.help == "==SUPPRESS=="]
    assert undocumented == []


def test_help_states_where_cli_and_library_defaults_differ(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "rtol 1e-8" in text and "scipy.sparse.linalg.cg (rtol 1e-5" in text


def test_json_dash_writes_report_to_stdout_and_human_report_to_stderr(capsys):
    code, out, err = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu", "--json", "-")
    assert code == 0
    rep = json.loads(out)
    assert rep["converged"] and rep["iterations"] == 183 and len(rep["history"]) == 184
    assert "converged in 183 iterations" in err and "true relative residual" in err


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_in_a_log_is_plain_lines_ending_with_the_final_state(capsys):
    code, out, err = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu", "--progress")
    assert code == 0 and "converged in 183 iterations" in out
    assert "\r" not in err
    lines = err.splitlines()
    assert lines and all(line.startswith("PCG: iteration ") for line in lines)
    assert lines[-1].startswith("PCG: iteration 183  ||r|| = ")


def test_progress_on_a_terminal_redraws_one_line_and_ends_with_the_final_state(capsys, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = main(["--matrix", EXAMPLE, "--device", "cpu", "--progress", "--json", "-"])
    rep = json.loads(capsys.readouterr().out)
    shown = terminal.getvalue()
    assert code == 0 and shown.endswith("\n")
    final = shown.rstrip("\n").split("\r")[-1]
    assert final.startswith("PCG: 183 iterations") and f"||r|| = {rep['residual_norm']:.3e}" in final


def test_progress_display_rate_limits_plain_lines():
    log = io.StringIO()
    progress = ResidualProgress(log, interval=3600.0)
    for it in range(1, 1000):
        progress(it, 1.0 / it)
    progress.close(1000, 1e-3)
    assert log.getvalue().splitlines() == ["PCG: iteration 1  ||r|| = 1.000e+00", "PCG: iteration 1,000  ||r|| = 1.000e-03"]


# -- preconditioner options ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def elasticity(tmp_path_factory):
    """A 2-D linear elasticity matrix file (2,048 rows) and its rigid body modes as .npy."""
    pytest.importorskip("pyamg")
    from solvers.gallery import linear_elasticity_2d
    folder = tmp_path_factory.mktemp("elasticity")
    A, B = linear_elasticity_2d((32, 32))
    scipy.io.mmwrite(str(folder / "elas.mtx"), A, symmetry="symmetric")
    np.save(folder / "B.npy", B)
    return folder / "elas.mtx", folder / "B.npy", B


def test_chebyshev_option_report_and_json(capsys, tmp_path):
    js = tmp_path / "r.json"
    code, out, _ = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu", "--precond", "chebyshev",
                           "--cheb-degree", "5", "--json", js)
    rep = json.loads(js.read_text())
    assert code == 0 and rep["preconditioner"] == "chebyshev" and rep["converged"]
    assert rep["preconditioner_details"]["degree"] == 5 and rep["iterations"] < 183 / 3  # Jacobi takes 183
    assert "chebyshev               degree 5 in D^-1 A on [" in out and "(preconditioner " in out
    assert 0 < rep["preconditioner_setup_time_s"] <= rep["setup_time_s"]


def test_amg_options_report_and_json(capsys, tmp_path, elasticity):
    matrix, nullspace, _ = elasticity
    js = tmp_path / "r.json"
    code, out, _ = run_cli(capsys, "--matrix", matrix, "--device", "cpu", "--precond", "amg", "--nullspace", nullspace,
                           "--amg-smoother", "jacobi", "--amg-sweeps", "2", "--amg-coarse-size", "20", "--json", js)
    rep = json.loads(js.read_text())
    details = rep["preconditioner_details"]
    assert code == 0 and rep["converged"] and rep["iterations"] < 20
    assert details["near_nullspace"] == "3 given vectors" and details["coarse_size"] == 20
    assert details["cycle"].startswith("V(2,2), jacobi") and len(details["levels"]) >= 3
    assert details["levels"][0] == {"rows": rep["n"], "nonzeros": rep["nnz"]}
    assert rep["preconditioner_setup_time_s"] == details["setup_time_s"] > 0 and rep["solve_time_s"] > 0
    lines = out.splitlines()
    amg = next(line for line in lines if line.startswith("amg  "))
    assert f"{len(details['levels'])} levels, operator complexity {details['operator_complexity']:.3f}" in amg
    for k, level in enumerate(details["levels"]):
        assert f"  level {k}               {level['rows']:,} rows, {level['nonzeros']:,} nonzeros" in lines


def test_amg_hierarchy_in_float32(capsys, tmp_path, elasticity):
    matrix, nullspace, _ = elasticity
    js = tmp_path / "r.json"
    code, _, _ = run_cli(capsys, "--matrix", matrix, "--device", "cpu", "--precond", "amg", "--nullspace", nullspace,
                         "--amg-hierarchy-dtype", "float32", "--json", js)
    rep = json.loads(js.read_text())
    assert code == 0 and rep["converged"] and rep["dtype"] == "float64"
    assert rep["preconditioner_details"]["hierarchy_dtype"] == "float32"


def test_amg_near_nullspace_from_text_and_without_it(capsys, tmp_path, elasticity):
    matrix, _, B = elasticity
    text = tmp_path / "B.txt"
    np.savetxt(text, B)
    code, out, _ = run_cli(capsys, "--matrix", matrix, "--device", "cpu", "--precond", "amg", "--nullspace", text, "-q")
    with_modes = int(out.split(", ")[1].split()[0])
    code_plain, out_plain, _ = run_cli(capsys, "--matrix", matrix, "--device", "cpu", "--precond", "amg", "-q")
    assert code == code_plain == 0 and with_modes < int(out_plain.split(", ")[1].split()[0])


PRECOND_OPTION_ERRORS = [
    (["--precond", "jacobi", "--cheb-degree", "4"], "--cheb-degree: applies to --precond chebyshev, or amg"),
    (["--precond", "amg", "--amg-smoother", "jacobi", "--cheb-degree", "4"], "--cheb-degree: applies to"),
    (["--precond", "chebyshev", "--amg-smoother", "jacobi"], "--amg-smoother: applies to --precond amg"),
    (["--precond", "amg", "--amg-sweeps", "2"], "--amg-sweeps: applies to --precond amg --amg-smoother jacobi"),
    (["--amg-coarse-size", "50"], "--amg-coarse-size: applies to --precond amg"),
    (["--amg-hierarchy-dtype", "float32"], "--amg-hierarchy-dtype: applies to --precond amg"),
    (["--precond", "amg", "--dtype", "float32", "--amg-hierarchy-dtype", "float64"],
     "--amg-hierarchy-dtype: float64 levels inside float32 CG gain nothing; take float32"),
    (["--precond", "none", "--nullspace", "B.npy"], "--nullspace: applies to --precond amg"),
    (["--precond", "chebyshev", "--cheb-degree", "0"], "--cheb-degree: must be >= 1, got 0"),
    (["--precond", "amg", "--amg-coarse-size", "5000"], "--amg-coarse-size: must be from 1 to 4096, got 5000"),
    (["--precond", "amg", "--device", "gpu", "--variant", "single-reduction"],
     "preconditioner 'amg': does not run the single-reduction PCG variant on the GPU (it takes classic)"),
    (["--precond", "chebyshev", "--mode", "graph", "--variant", "single-reduction"],
     "preconditioner 'chebyshev': does not run the single-reduction PCG variant on the GPU"),
]


@pytest.mark.parametrize("options, message", PRECOND_OPTION_ERRORS)
def test_preconditioner_option_errors_are_one_line(capsys, options, message):
    code, out, err = run_cli(capsys, "--matrix", EXAMPLE, *options)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and err.startswith(f"error: {message}"), err


def test_bad_nullspace_file_is_named(capsys, tmp_path, elasticity):
    matrix, _, B = elasticity
    short, zero = tmp_path / "short.npy", tmp_path / "zero.npy"
    np.save(short, B[:-2])
    np.save(zero, np.c_[B, np.zeros(B.shape[0])])
    for path, message in ((short, f"vectors have {B.shape[0] - 2} rows but the matrix has {B.shape[0]} rows"),
                          (zero, "the near-nullspace has a zero vector"),
                          (tmp_path / "missing.npy", "no such file")):
        code, out, err = run_cli(capsys, "--matrix", matrix, "--device", "cpu", "--precond", "amg",
                                 "--nullspace", path)
        assert code == 2 and err.strip() == f"error: {path}: {message}", err


def test_kernel_path_option_is_for_the_gpu(capsys):
    code, out, err = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu", "--path", "on-chip")
    assert code == 2 and err.strip() == "error: --path: 'on-chip' is a GPU kernel; the CPU solver takes 'auto'"
    assert not out
    code, out, _ = run_cli(capsys, "--matrix", EXAMPLE, "--device", "cpu", "--path", "auto", "--json", "-")
    assert code == 0 and '"path": "cpu"' in out
