"""Distributed CLI under ``mpiexec -n 2``: ranks agree on their options, and nothing hangs.

The runs that used to hang: a different ``--variant`` per rank (an MPMD
launch), ``--output`` on rank 0 only, ``--device gpu`` on one rank, SIGINT to
one rank; mismatched ``--maxiter``/``--rtol``/``--dtype`` ended in MPI
truncation dumps; a stopped rank left the job waiting forever. Each must end
within seconds with one message.
"""
import os
import signal
import subprocess
import sys
import time

import pytest
import scipy.io

from solvers.gallery import poisson

from contract import EXAMPLE, REPO, assert_one_line_error
from test_dist import _mpi_command

pytestmark = pytest.mark.mpi


def _env(extra=None):
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(extra or {})}


def run_ranks(rank0, rank1, *, timeout=60, env=None):
    """One ``python -m solvers.pcg`` per rank with its own arguments (an MPMD launch)."""
    launch = _mpi_command(1, _env(env))[:-2]
    command = [*launch, "-n", "1", sys.executable, "-m", "solvers.pcg", *map(str, rank0),
               ":", "-n", "1", sys.executable, "-m", "solvers.pcg", *map(str, rank1)]
    t0 = time.monotonic()
    proc = subprocess.run(command, cwd=REPO, env=_env(env), capture_output=True, text=True, timeout=timeout)
    proc.seconds = time.monotonic() - t0
    return proc


def _error_lines(stderr):
    """Our lines (the MPI library may add its own about MPI_Abort)."""
    return "\n".join(line for line in stderr.splitlines() if line.startswith("error: "))


COMMON = ["--matrix", EXAMPLE, "--device", "cpu"]


@pytest.mark.parametrize("rank0, rank1, needle", [
    (["--variant", "classic"], ["--variant", "single-reduction"], "--variant is 'single-reduction' here"),
    (["--output", "x.npy"], [], "--output is not given here but 'x.npy' on rank 0"),
    ([], ["--device", "gpu"], "--device is 'gpu' here but 'cpu' on rank 0"),
    (["--maxiter", "5"], ["--maxiter", "7"], "--maxiter is 7 here but 5 on rank 0"),
    (["--rtol", "1e-8"], ["--rtol", "1e-6"], "--rtol is 1e-06 here but 1e-08 on rank 0"),
    ([], ["--dtype", "float32"], "--dtype is 'float32' here but 'float64' on rank 0"),
    ([], ["--rhs", "missing.npy"], "--rhs is 'missing.npy' here but not given on rank 0"),
    ([], ["--variant", "pipelined"], "rank 1: bad command line: argument --variant: invalid choice"),
    ([], ["--rtol", "nan"], "rank 1: --rtol: must be a finite number"),
])
def test_mismatched_options_end_every_rank_with_one_message(tmp_path, rank0, rank1, needle):
    out = [a if not a.endswith(".npy") else str(tmp_path / a) for a in rank0]
    proc = run_ranks(COMMON + out, COMMON + rank1)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, needle.replace("'x.npy'", repr(str(tmp_path / "x.npy"))))
    assert proc.stdout == "" and proc.seconds < 30
    assert list(tmp_path.iterdir()) == []


def test_a_different_matrix_on_rank_1_is_checked(tmp_path):
    proc = run_ranks(COMMON, ["--matrix", tmp_path / "missing.mtx", "--device", "cpu"])
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "rank 1: options differ from rank 0's: --matrix is", "missing.mtx")


def test_help_on_every_rank_exits_0():
    proc = run_ranks(["--help"], ["--help"])
    assert proc.returncode == 0 and "usage:" in proc.stdout


@pytest.fixture(scope="module")
def long_problem(tmp_path_factory):
    """A problem that runs for minutes on two CPU ranks unless stopped (tolerance 0)."""
    path = tmp_path_factory.mktemp("long") / "poisson300.mtx"
    scipy.io.mmwrite(str(path), poisson((300, 300)).tocsr())
    return ["--matrix", path, "--device", "cpu", "--rtol", "0", "--maxiter", "1000000"]


def _handles_sigterm(pid):
    """True once the process has installed its own SIGTERM handler (the CLI is running)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def _rank_pid(launcher, rank, deadline=60):
    """The pid of ``rank`` of the job started by ``launcher``, once its CLI handles signals."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            mine = f"GRAPHSOLVE_TEST_JOB={launcher.pid}".encode() in env
            if mine and f"PMI_RANK={rank}".encode() in env and b"solvers.pcg" in cmdline and _handles_sigterm(entry):
                return int(entry)
        time.sleep(0.1)
    raise AssertionError(f"rank {rank} did not start")


def _cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_until_solving(pid, seconds=2.0, deadline=60):
    """Wait until the rank has used ``seconds`` of CPU time: started up, read the matrix, now iterating."""
    end = time.monotonic() + deadline
    while _cpu_seconds(pid) < seconds:
        assert time.monotonic() < end, "the rank did not start solving"
        time.sleep(0.1)


def _start(args, env=None):
    env = _env({**(env or {}), "GRAPHSOLVE_TEST_JOB": "pending"})
    command = [*_mpi_command(2, env), sys.executable, "-m", "solvers.pcg", *map(str, args)]
    # The job id goes into every rank's environment so that the test finds its own ranks.
    launcher = subprocess.Popen(["sh", "-c", 'GRAPHSOLVE_TEST_JOB=$$ exec "$@"', "sh", *command], cwd=REPO,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    return launcher


def _finish(launcher, timeout):
    try:
        out, err = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.communicate()
        raise AssertionError("the job hung")
    return launcher.returncode, out, err


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_one_rank_aborts_the_job(long_problem, signum, code):
    launcher = _start(long_problem)
    os.kill(_rank_pid(launcher, 1), signum)
    t0 = time.monotonic()
    returncode, out, err = _finish(launcher, timeout=30)
    assert time.monotonic() - t0 < 10
    assert returncode == code, err
    assert _error_lines(err) == f"error: rank 1: interrupted by {signal.Signals(signum).name}"
    assert "Traceback" not in err


# Rank 1 signals itself as soon as its handlers are in place, before MPI is up: the signal is held
# until the rank can end the whole job, then ends it (acted on at once, the other rank would wait).
SIGNAL_AT_START = """
import os, signal, sys
from solvers.distributed import cli, launch
real = cli.run_distributed
def signalled(*args, **kwargs):
    if launch.rank() == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)
cli.run_distributed = signalled
from solvers.pcg.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_signal_before_mpi_is_up_ends_the_job():
    env = _env()
    command = [*_mpi_command(2, env), sys.executable, "-c", SIGNAL_AT_START, "--matrix", str(EXAMPLE),
               "--device", "cpu"]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 143, proc.stderr
    assert _error_lines(proc.stderr) == "error: rank 1: interrupted by SIGTERM"


@pytest.mark.parametrize("how", ["option", "environment"])
def test_stopped_rank_is_ended_by_the_watchdog(long_problem, how):
    args = long_problem + (["--timeout", "2"] if how == "option" else [])
    launcher = _start(args, env={"GRAPHSOLVE_TIMEOUT": "2"} if how == "environment" else None)
    stopped = _rank_pid(launcher, 1)
    _wait_until_solving(_rank_pid(launcher, 0))  # the watchdog runs from MPI's start-up on
    os.kill(stopped, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        returncode, out, err = _finish(launcher, timeout=30)
    finally:  # the launcher's SIGTERM waits until the stopped rank runs again: end it here
        os.kill(stopped, signal.SIGKILL)
    assert time.monotonic() - t0 < 10
    assert returncode == 1
    assert _error_lines(err).startswith("error: rank 0: no progress for 2 s (watchdog timeout 2 s)")


# Each rank limits the size of the files it writes once MPI is up (MPI's own shared-memory files
# must not hit the limit), then runs the CLI.
LIMITED_WRITES = """
import resource, signal, sys
from mpi4py import MPI
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000))
from solvers.pcg.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_full_disk_on_rank_0_is_one_line(tmp_path):
    target = tmp_path / "x.mtx"
    target.write_text("previous")
    env = _env()
    proc = subprocess.run([*_mpi_command(2, env), sys.executable, "-c", LIMITED_WRITES, *map(str, COMMON), "-q",
                           "--output", str(target)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, "rank 0:", target, "cannot write solution")
    assert target.read_text() == "previous"
