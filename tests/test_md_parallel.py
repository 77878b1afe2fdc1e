"""One MD simulation over CPU ranks, launched through ``mpiexec`` (``-n 2`` and ``-n 3``).

``tests/test_md_mpi.py`` runs on every rank; the CLI tests here check what a
user sees: one log, restarts across rank counts, errors and failures that end
every rank.
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from test_dist import REPO, TIMEOUT, _mpi_command, run_mpi

pytestmark = pytest.mark.mpi
SMALL = ["--cells", "6", "6", "6", "--device", "cpu", "--thermo", "10"]


def rows(out):
    """Thermo rows of a log: {step: [Temp, E_pair, TotEng, Press]}."""
    table = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 7 and f[0].isdigit():
            table[int(f[0])] = [float(v) for v in f[1:5]]
    return table


@pytest.mark.parametrize("ranks", [2, 3])
def test_multi_rank_suite(ranks):
    proc = run_mpi(ranks, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_md_mpi.py", timeout=2 * TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1]


def test_cli_restart_written_by_2_ranks_resumes_on_3(tmp_path):
    serial = run_mpi(1, "-m", "solvers.md", *SMALL, "--steps", "60")
    assert serial.returncode == 0, serial.stderr
    first = run_mpi(2, "-m", "solvers.md", *SMALL, "--steps", "30", "--restart", tmp_path / "r.npz",
                    "--log", tmp_path / "first.log")
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("Loop time of") == 1 and "on 2 procs for 30 steps with 864 atoms" in first.stdout
    assert (tmp_path / "first.log").read_text() == first.stdout
    resumed = run_mpi(3, "-m", "solvers.md", "--resume", tmp_path / "r.npz", "--device", "cpu", "--steps", "30",
                      "--thermo", "10")
    assert resumed.returncode == 0, resumed.stderr
    assert re.search(r"3 ranks \(grid \d x \d x \d\)", resumed.stdout)
    want, got = rows(serial.stdout), rows(resumed.stdout)
    assert sorted(got) == [30, 40, 50, 60]
    for step in got:
        np.testing.assert_allclose(got[step], want[step], rtol=1e-8)
    builds = [re.search(r"Neighbor list builds = (\d+)", p.stdout).group(1) for p in (serial, resumed)]
    assert builds[0] == builds[1]


def test_cli_bad_input_ends_every_rank_with_one_message(tmp_path):
    proc = run_mpi(3, "-m", "solvers.md", "--data", tmp_path / "missing.dump", "--device", "cpu", timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("error:") == 1 and "missing.dump: no such file" in proc.stderr
    thin = run_mpi(3, "-m", "solvers.md", "--cells", "3", "3", "3", "--skin", "0.2", "--device", "cpu", timeout=60)
    assert thin.returncode == 2 and thin.stderr.count("cannot split the box") == 1, thin.stderr
    mode = run_mpi(2, "-m", "solvers.md", "--cells", "6", "6", "6", "--mode", "while", "--device", "cpu", timeout=60)
    assert mode.returncode == 2 and mode.stderr.count("--mode: applies to single-process runs") == 1, mode.stderr


def test_cli_blowup_exit_1_on_every_rank():
    proc = run_mpi(2, "-m", "solvers.md", "--cells", "6", "6", "6", "--dt", "0.5", "--steps", "100", "--device",
                   "cpu", timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("blew up") == 1


FAULT = """
import os, signal, sys
from mpi4py import MPI
from solvers.distributed.comm import abort_on_error
from solvers.md import LennardJones, Simulation, VelocityVerlet, lattice_state
comm = MPI.COMM_WORLD
sim = Simulation(lattice_state(cells=(6, 6, 6)), LennardJones(), VelocityVerlet(), device="cpu", comm=comm)
if comm.rank == 1:
    original = sim._backend._forces
    calls = [0]
    def forces(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 5:
            if sys.argv[1] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise MemoryError("injected failure")
        return original(*args, **kwargs)
    sim._backend._forces = forces
with abort_on_error(comm):
    sim.run(50)
print("finished", comm.rank)
"""


@pytest.mark.parametrize("fault", ["raise", "kill"])
def test_failing_rank_ends_the_job(fault):
    proc = run_mpi(2, "-c", FAULT, fault, timeout=60)
    assert proc.returncode != 0 and "finished" not in proc.stdout
    if fault == "raise":
        assert "error: rank 1: MemoryError: injected failure" in proc.stderr
    assert proc.seconds < 30


def test_benchmark_script_on_cpu_ranks(tmp_path):
    _mpi_command(1, os.environ)  # skip (or fail) without MPI, like the other launches
    proc = subprocess.run([sys.executable, "scripts/bench_dist_md.py", "--gpus", "1", "2", "--sizes", "4000",
                           "--device", "cpu", "--precision", "double", "--seconds", "0.2", "--out", str(tmp_path)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    table = next(tmp_path.glob("bench_dist_md_*.md")).read_text()
    lines = [line for line in table.splitlines() if line.startswith("| 4,000 |")]
    assert len(lines) == 2 and "one process" in lines[0] and "2 rank(s)" in lines[1]
    builds = [line.split(" | ")[-2] for line in lines]
    assert builds[0] == builds[1]  # the same list builds
    assert lines[1].split(" | ")[-1] == f"{builds[1]} |"  # the CPU ranks migrate at every build
