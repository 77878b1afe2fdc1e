"""Distributed PCG: serial pieces here, multi-rank runs through ``mpiexec``.

The ``mpi`` tests start ``mpiexec -n 2`` and ``-n 3`` (an uneven split) on
``tests/test_dist_mpi.py`` and on the CLI. Without ``mpiexec`` or mpi4py they
are skipped, unless ``REQUIRE_MPI=1``, in which case they fail.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import scipy.sparse as sp

from solvers.distributed import launch
from solvers.distributed.cpu import pcg_single_reduction
from solvers.distributed.partition import nnz_bounds
from solvers.distributed.problem import poisson_rows
from solvers.errors import InputError
from solvers.gallery import poisson
from solvers.pcg.cpu import pcg_iterate
from solvers.pcg.result import Reason

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "data" / "lap2D_5pt_n100.mtx"
TIMEOUT = 120  # seconds for one mpiexec run; a hang fails the test instead of blocking CI


# -- launcher detection ---------------------------------------------------------------------
@pytest.mark.parametrize("env, expected", [
    ({}, None),
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "2"}, ("Open MPI", 4, 2)),
    ({"PMI_SIZE": "3", "PMI_RANK": "1"}, ("MPICH/Hydra", 3, 1)),
    ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, ("Slurm", 2, 1)),
    # A batch script's own shell inside a 2-task allocation is not a distributed launch.
    ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0"}, None),
    ({"PMI_SIZE": "x", "PMI_RANK": "0"}, None),
])
def test_detect_launch(env, expected):
    assert launch.detect(env) == expected
    assert launch.world_size(env) == (expected[1] if expected else 1)
    assert launch.rank(env) == (expected[2] if expected else 0)


def test_package_and_cli_import_without_mpi():
    code = ("import sys, solvers.distributed, solvers.pcg.__main__; "
            "assert 'mpi4py' not in sys.modules and 'cupy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


# -- partition -------------------------------------------------------------------------------
def test_bounds_balance_nonzeros():
    row_nnz = np.r_[np.full(50, 10), np.full(150, 2)]   # 500 + 300 nonzeros
    bounds = nnz_bounds(row_nnz, 0, row_nnz.size, 4)
    assert bounds[0] == 0 and bounds[-1] == 200 and np.all(np.diff(bounds) > 0)
    per_rank = [row_nnz[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])]
    assert max(per_rank) - min(per_rank) <= 10


def test_bounds_keep_every_block_non_empty():
    bounds = nnz_bounds(np.array([1000, 1, 1, 1]), 0, 4, 4)   # one heavy row
    np.testing.assert_array_equal(bounds, [0, 1, 2, 3, 4])


def test_more_ranks_than_rows_is_an_input_error():
    with pytest.raises(InputError, match="5 ranks for a matrix of 4 rows"):
        nnz_bounds(np.ones(4, dtype=int), 0, 4, 5)


@pytest.mark.parametrize("shape, lo, hi", [((7, 5), 0, 35), ((7, 5), 9, 23), ((4, 5, 6), 17, 101),
                                           ((4, 5, 6), 0, 1)])
def test_poisson_rows_match_the_global_matrix(shape, lo, hi):
    rows = poisson_rows(shape, lo, hi)
    expected = poisson(shape)[lo:hi]
    assert rows.shape == expected.shape and rows.has_sorted_indices
    assert (rows != expected).nnz == 0


def test_auto_variant_follows_rows_per_rank():
    from solvers.distributed.solver import CLASSIC_MIN_ROWS_PER_RANK, auto_variant
    assert auto_variant(CLASSIC_MIN_ROWS_PER_RANK * 2 - 1, 2) == "single-reduction"
    assert auto_variant(CLASSIC_MIN_ROWS_PER_RANK * 2, 2) == "classic"
    assert auto_variant(CLASSIC_MIN_ROWS_PER_RANK * 2, 3) == "single-reduction"


# -- single-reduction recurrences against the reference iteration -----------------------------
def _pair(A, b, tol=1e-8, maxiter=1000, x0=None):
    d = 1.0 / A.diagonal()
    runs = []
    for variant in ("classic", "single-reduction"):
        x = np.zeros_like(b) if x0 is None else x0.copy()
        history = []
        if variant == "classic":
            out = pcg_iterate(A.dot, lambda r: d * r, b, x, tol, maxiter, None, history)
        else:
            out = pcg_single_reduction(A.dot, lambda r: d * r, b, x, tol, maxiter, history=history, x_is_zero=x0 is None)
        runs.append((out, x, np.array(history)))
    return runs


def test_single_reduction_matches_classic():
    A = poisson((12, 12, 12)).tocsr()
    b = A @ np.linspace(1, 2, A.shape[0])
    (c_out, c_x, c_hist), (s_out, s_x, s_hist) = _pair(A, b, tol=1e-10 * np.linalg.norm(b))
    assert c_out[0] is s_out[0] is Reason.CONVERGED
    assert c_out[1] == s_out[1] > 10
    np.testing.assert_allclose(s_x, c_x, rtol=1e-9)
    np.testing.assert_allclose(s_hist, c_hist, rtol=1e-6)


def test_single_reduction_with_initial_guess():
    A = poisson((20, 20)).tocsr()
    b = np.ones(A.shape[0])
    x0 = np.linspace(0, 1, A.shape[0])
    (c_out, c_x, _), (s_out, s_x, _) = _pair(A, b, x0=x0)
    assert c_out[:2] == s_out[:2]
    np.testing.assert_allclose(s_x, c_x, rtol=1e-8)


@pytest.mark.parametrize("case", ["maxiter", "zero-rhs", "nan", "indefinite"])
def test_single_reduction_stop_reasons_match_classic(case):
    A, b, maxiter = poisson((10, 10)).tocsr(), np.ones(100), 1000
    if case == "maxiter":
        maxiter = 5
    elif case == "zero-rhs":
        b = np.zeros(100)
    elif case == "nan":
        b[7] = np.nan
    else:
        A = sp.diags(np.r_[np.ones(50), -np.ones(50)]).tocsr() + sp.eye(100, k=1) * 0.1
        A = ((A + A.T) / 2).tocsr()
        A.setdiag(np.abs(A.diagonal()))  # positive diagonal (Jacobi applies), indefinite matrix
        A = A - sp.diags(np.r_[np.zeros(50), 2 * np.ones(50)])
    (c_out, _, _), (s_out, _, _) = _pair(A, b, tol=1e-8, maxiter=maxiter)
    assert c_out[0] is s_out[0]
    assert c_out[1] == s_out[1]
    expected = {"maxiter": Reason.MAX_ITERATIONS, "zero-rhs": Reason.CONVERGED, "nan": Reason.NOT_FINITE,
                "indefinite": Reason.BREAKDOWN}[case]
    assert c_out[0] is expected


# -- multi-rank runs -------------------------------------------------------------------------------
def _mpi_command(ranks, env):
    """``mpiexec -n ranks`` for the MPI found on PATH, or skip/fail when there is none."""
    exe = shutil.which(os.environ.get("GRAPHSOLVE_MPIEXEC", "mpiexec"))
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        exe = None
    if exe is None:
        reason = "mpiexec or mpi4py not installed (pip install mpi4py mpich)"
        if os.environ.get("REQUIRE_MPI") == "1":
            pytest.fail(f"REQUIRE_MPI=1 but {reason}")
        pytest.skip(reason)
    return launch.mpiexec_command(ranks, env, exe)


def run_mpi(ranks, *args, timeout=TIMEOUT, env=None):
    """Run ``python args...`` on ``ranks`` ranks; the result also has ``seconds``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    t0 = time.monotonic()
    proc = subprocess.run([*_mpi_command(ranks, env), sys.executable, *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    proc.seconds = time.monotonic() - t0
    return proc


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_multi_rank_suite(ranks):
    proc = run_mpi(ranks, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_dist_mpi.py")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1]


@pytest.mark.mpi
@pytest.mark.parametrize("variant", ["classic", "single-reduction"])
def test_cli_one_report_and_whole_solution(tmp_path, variant):
    out, js = tmp_path / "x.npy", tmp_path / "r.json"
    proc = run_mpi(3, "-m", "solvers.pcg", "--matrix", EXAMPLE, "--device", "cpu", "--variant", variant,
                   "--output", out, "--json", js)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("matrix ") == 1 and "ranks                   3" in proc.stdout
    assert "communication" in proc.stdout and "converged in 183 iterations" in proc.stdout
    from solvers.pcg.problem import load_problem
    from solvers.pcg import PCG
    problem = load_problem(str(EXAMPLE))
    ref = PCG(problem.A, rtol=1e-8, device="cpu").solve(problem.b)
    np.testing.assert_allclose(np.load(out), ref.x, rtol=1e-10)
    import json
    rep = json.loads(js.read_text())
    assert rep["ranks"] == 3 and rep["iterations"] == ref.iterations == len(rep["history"]) - 1
    assert rep["communication_time_s"] > 0 and rep["compute_time_s"] > 0


@pytest.mark.mpi
def test_cli_bad_file_ends_every_rank(tmp_path):
    proc = run_mpi(3, "-m", "solvers.pcg", "--matrix", tmp_path / "missing.mtx", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("no such file") == 1, proc.stderr
    assert proc.stdout == ""


@pytest.mark.mpi
def test_cli_more_ranks_than_rows(tmp_path):
    path = tmp_path / "two.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real symmetric\n2 2 2\n1 1 2\n2 2 3\n")
    proc = run_mpi(3, "-m", "solvers.pcg", "--matrix", path, timeout=60)
    assert proc.returncode == 2
    assert "3 ranks for a matrix of 2 rows" in proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("option", [["--mode", "while"], ["--progress"]])
def test_cli_single_process_options_are_rejected_under_mpi(option):
    proc = run_mpi(2, "-m", "solvers.pcg", "--matrix", EXAMPLE, *option, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count(f"{option[0]} applies to single-process runs") == 1


@pytest.mark.mpi
def test_cli_single_process_preconditioner_is_refused_under_mpi():
    proc = run_mpi(2, "-m", "solvers.pcg", "--matrix", EXAMPLE, "--device", "cpu", "--precond", "amg", timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("error: preconditioner 'amg': runs in a single process only; distributed runs "
                                   "take none or jacobi"), proc.stderr


@pytest.mark.mpi
def test_cli_bundled_example_and_json_to_stdout_under_mpi():
    proc = run_mpi(2, "-m", "solvers.pcg", "--example", "lap2D_5pt_n100", "--device", "cpu", "--json", "-",
                   timeout=60)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["ranks"] == 2 and rep["converged"] and rep["matrix"] == "lap2D_5pt_n100.mtx"
    assert proc.stderr.count("matrix ") == 1 and "ranks                   2" in proc.stderr


# A solve in which one rank fails part-way: the others are blocked in MPI calls and must be ended.
FAULT = """
import os, signal, sys
from mpi4py import MPI
from solvers.distributed import DistributedPCG
from solvers.distributed.comm import abort_on_error
from solvers.distributed.cpu import DistCPUPCG
from solvers.distributed.problem import poisson_distributed
comm = MPI.COMM_WORLD
p = poisson_distributed(comm, (30, 30))
solver = DistributedPCG(p.rows, p.bounds, comm, device="cpu", rtol=1e-10)
if comm.rank == 1:
    calls = [0]
    original = solver._impl.matvec
    def matvec(v):
        calls[0] += 1
        if calls[0] == 5:
            if sys.argv[1] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise MemoryError("injected failure")
        return original(v)
    solver._impl.matvec = matvec
with abort_on_error(comm):
    solver.solve(p.b)
print("finished", comm.rank)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("fault", ["raise", "kill"])
def test_failing_rank_ends_the_job(fault):
    proc = run_mpi(2, "-c", FAULT, fault, timeout=60)
    assert proc.returncode != 0
    assert "finished" not in proc.stdout
    if fault == "raise":
        assert "error: rank 1: MemoryError: injected failure" in proc.stderr
    assert proc.seconds < 30


def test_launcher_mismatch_is_reported():
    pytest.importorskip("mpi4py")
    # Open MPI's variables announce 2 ranks, but the process is started alone.
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}
    proc = subprocess.run([sys.executable, "-m", "solvers.pcg", "--matrix", str(EXAMPLE)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Open MPI announced 2 ranks but MPI sees 1" in proc.stderr


def test_mpiexec_command_knows_open_mpi(tmp_path):
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 4.1.6'\n")
    fake.chmod(0o755)
    cmd = launch.mpiexec_command(2, {"PYTHONPATH": ".", "NCCL_NVLS_ENABLE": "0"}, str(fake))
    assert cmd[:3] == [str(fake), "--allow-run-as-root", "--oversubscribe"] and cmd[-2:] == ["-n", "2"]
    assert cmd[3:-2] == ["-x", "PYTHONPATH", "-x", "NCCL_NVLS_ENABLE"]
    fake.write_text("#!/bin/sh\necho 'HYDRA build details:'\n")
    assert launch.mpiexec_command(3, {}, str(fake)) == [str(fake), "-n", "3"]


@pytest.mark.mpi
@pytest.mark.parametrize("scaling", [["--sizes", "10", "--small"], ["--weak", "500"]])
def test_benchmark_script_runs_on_cpu_ranks(tmp_path, scaling):
    _mpi_command(1, os.environ)  # skip (or fail) without MPI, like the other launches
    proc = subprocess.run([sys.executable, "scripts/bench_dist.py", "--gpus", "1", "2", *scaling,
                           "--iterations", "10", "--repeats", "1", "--device", "cpu", "--out", str(tmp_path)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    table = next(tmp_path.glob("bench_dist_*.md")).read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "^3" in line]
    assert len(rows) == 5  # 1 rank: both variants and the single-process solver; 2 ranks: both variants
    assert {"classic", "single-reduction"} <= {r.split(" | ")[3] for r in rows}
    assert ("efficiency" in table) == ("--weak" in scaling)


@pytest.mark.mpi
def test_input_error_on_one_rank_outside_set_up_aborts():
    code = ("from mpi4py import MPI\nfrom solvers.distributed.comm import abort_on_error\nfrom solvers.errors import InputError\n"
            "comm = MPI.COMM_WORLD\nwith abort_on_error(comm):\n    if comm.rank == 1:\n"
            "        raise InputError('only here')\n    comm.barrier()\nprint('finished')\n")
    proc = run_mpi(2, "-c", code, timeout=60)
    assert proc.returncode != 0 and "finished" not in proc.stdout
    assert "error: rank 1: InputError: only here" in proc.stderr
