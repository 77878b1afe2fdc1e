"""The Slurm batch scripts, run for real on a private single-node cluster.

``scripts/slurm/local_cluster.sh start`` brings up munged, slurmctld and slurmd
on this machine with all state in a temporary folder; the node advertises two
placeholder GPUs so the scripts' ``--gpus-per-task=1`` is scheduled as on a GPU
cluster, while the jobs themselves run the CPU path (``DEVICE=cpu``). Each test
submits with ``sbatch --wait`` and checks the job's output file. The daemons are
stopped by the fixture's finalizer, whatever the tests did.

Without the Slurm binaries (``scripts/slurm/local_cluster.sh install`` puts
them there, root) the cluster tests are skipped, unless ``REQUIRE_SLURM=1``, in
which case they fail.
"""
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SLURM_SCRIPTS = REPO / "scripts" / "slurm"
LOCAL_CLUSTER = SLURM_SCRIPTS / "local_cluster.sh"
BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "sinfo", "squeue", "scancel", "scontrol",
            "munged", "munge", "unmunge")
REQUIRED = os.environ.get("REQUIRE_SLURM") == "1"
JOB_TIMEOUT = 120  # seconds for one sbatch --wait; the jobs take a few seconds
EXAMPLE_MATRIX = REPO / "examples" / "data" / "lap2D_5pt_n100.mtx"

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


def _which(name):
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _unavailable():
    """Why the cluster cannot run here, or None."""
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        return (f"Slurm/munge binaries not installed (missing: {', '.join(missing)}); "
                "run scripts/slurm/local_cluster.sh install as root")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install -e '.[mpi]')"
    return None


# ----------------------------------------------------------------------------- static checks

SHELL_SCRIPTS = sorted(SLURM_SCRIPTS.glob("*.sh")) + sorted(SLURM_SCRIPTS.glob("*.sbatch"))


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = script.read_text()
    if script.suffix == ".sbatch" or text.startswith("#!"):
        assert "set -euo pipefail" in text, f"{script.name} must run with set -euo pipefail"


def test_scripts_pass_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", "-x", *map(str, SHELL_SCRIPTS)], capture_output=True,
                          text=True, cwd=SLURM_SCRIPTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- the cluster

class Cluster:
    def __init__(self, state, env):
        self.state = pathlib.Path(state)
        self.env = env
        self.jobs = self.state / "jobs"
        self.jobs.mkdir(exist_ok=True)

    def logs(self):
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            path = self.state / "log" / name
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-15:]
                parts.append(f"--- {name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def sbatch(self, script, *options, env=None, timeout=JOB_TIMEOUT):
        """Submit with ``sbatch --wait`` from the jobs folder; return a :class:`Job`."""
        cmd = ["sbatch", "--wait", "--parsable",
               f"--output={self.jobs}/%x-%j.out", f"--error={self.jobs}/%x-%j.err",
               *options, str(script)]
        run_env = dict(self.env, **(env or {}))
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=self.jobs, env=run_env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{' '.join(cmd)} did not finish in {timeout}s\n"
                        f"{exc.stdout}\n{exc.stderr}\n{self.logs()}")
        match = re.search(r"^(\d+)", proc.stdout, re.M)
        assert match, f"sbatch printed no job id (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n{self.logs()}"
        return Job(self, int(match.group(1)), proc.returncode, time.monotonic() - start, proc.stderr)


class Job:
    def __init__(self, cluster, job_id, returncode, seconds, sbatch_stderr):
        self.id, self.returncode, self.seconds = job_id, returncode, seconds
        outs = sorted(cluster.jobs.glob(f"*-{job_id}.out"))
        errs = sorted(cluster.jobs.glob(f"*-{job_id}.err"))
        self.out_path = outs[0] if outs else None
        self.out = outs[0].read_text(errors="replace") if outs else ""
        self.err = errs[0].read_text(errors="replace") if errs else ""
        self.sbatch_stderr = sbatch_stderr
        self.cluster = cluster

    def describe(self):
        return (f"job {self.id}: sbatch rc {self.returncode} after {self.seconds:.1f}s\n"
                f"--- stdout ({self.out_path})\n{self.out}\n--- stderr\n{self.err}\n"
                f"--- sbatch\n{self.sbatch_stderr}\n{self.cluster.logs()}")

    def assert_ok(self):
        assert self.returncode == 0, self.describe()


def _pids(state):
    pids = {}
    for name in ("munged", "slurmctld", "slurmd"):
        path = pathlib.Path(state) / "run" / f"{name}.pid"
        if path.exists() and path.read_text().strip().isdigit():
            pids[name] = int(path.read_text().strip())
    return pids


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def cluster():
    reason = _unavailable()
    if reason:
        if REQUIRED:
            pytest.fail(f"REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    # Short path: munged's socket and slurmd's step sockets live under it.
    state = tempfile.mkdtemp(prefix="gs-slurm-")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMI_"))}
    env.update(GS_SLURM_DIR=state, GS_SLURM_GPUS="2", PYTHON=sys.executable,
               PATH=os.pathsep.join([str(pathlib.Path(sys.executable).parent),
                                     env.get("PATH", ""), "/usr/sbin", "/sbin"]))
    pids = {}
    try:
        proc = subprocess.run([str(LOCAL_CLUSTER), "start"], env=env, capture_output=True,
                              text=True, timeout=120)
        pids = _pids(state)
        if proc.returncode != 0:
            pytest.fail(f"local_cluster.sh start failed (rc {proc.returncode}):\n"
                        f"{proc.stdout}\n{proc.stderr}")
        assert f"export SLURM_CONF={state}/slurm.conf" in proc.stdout, proc.stdout
        env["SLURM_CONF"] = f"{state}/slurm.conf"
        yield Cluster(state, env)
    finally:
        pids = _pids(state) or pids
        stop = subprocess.run([str(LOCAL_CLUSTER), "stop"], env=env, capture_output=True,
                              text=True, timeout=120)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = {n: p for n, p in pids.items() if _alive(p)}
        for pid in left.values():  # our own daemons only, by the pids they wrote
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(state, ignore_errors=True)
        assert stop.returncode == 0, stop.stderr
        assert not left, f"daemons still running after stop: {left}"


# ----------------------------------------------------------------------------- jobs

RANK_PROBE = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
              "print(f'rank {c.Get_rank()} of {c.Get_size()}', flush=True)")


def test_srun_pmi2_makes_one_mpi_world(cluster):
    """srun --mpi=pmi2 + the PyPI mpich wheel: one world of 2; plain srun: 2 worlds of 1."""
    py = sys.executable
    wrap = (f"srun --mpi=pmi2 {py} -c \"{RANK_PROBE}\"; echo ---; "
            f"srun --mpi=none {py} -c \"{RANK_PROBE}\"")
    job = _wrap_job(cluster, wrap)
    job.assert_ok()
    pmi2, plain = job.out.split("---\n")
    assert sorted(re.findall(r"rank \d of \d", pmi2)) == ["rank 0 of 2", "rank 1 of 2"], job.describe()
    assert re.findall(r"rank \d of \d", plain) == ["rank 0 of 1", "rank 0 of 1"], job.describe()


def _wrap_job(cluster, wrap):
    cmd = ["sbatch", "--wait", "--parsable", "--ntasks=2", "--job-name=mpi-probe",
           f"--output={cluster.jobs}/%x-%j.out", f"--error={cluster.jobs}/%x-%j.err",
           f"--wrap={wrap}"]
    proc = subprocess.run(cmd, cwd=cluster.jobs, env=cluster.env, capture_output=True, text=True,
                          timeout=JOB_TIMEOUT)
    match = re.search(r"^(\d+)", proc.stdout, re.M)
    assert match, proc.stdout + proc.stderr + cluster.logs()
    return Job(cluster, int(match.group(1)), proc.returncode, 0.0, proc.stderr)


def _reference_pcg(matrix, rtol):
    """The same solve, serial and outside Slurm: the numbers the job must reproduce."""
    with tempfile.TemporaryDirectory() as tmp:
        report = pathlib.Path(tmp) / "ref.json"
        proc = subprocess.run([sys.executable, "-m", "solvers.pcg", "--matrix", str(matrix),
                               "--rtol", str(rtol), "--device", "cpu", "--json", str(report)],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(report.read_text()), proc.stdout


def _task_lines(out):
    return re.findall(r"^task (\d+)/(\d+) on \S+ \(local (\d+)\): CUDA_VISIBLE_DEVICES=(\S+)$", out, re.M)


def test_pcg_sbatch_two_tasks(cluster):
    rtol = 1e-10
    job = cluster.sbatch(SLURM_SCRIPTS / "pcg.sbatch",
                         f"--export=ALL,DEVICE=cpu,RTOL={rtol},MATRIX={EXAMPLE_MATRIX}")
    job.assert_ok()
    out = job.out
    assert f"=== graphsolve PCG, job {job.id}" in out, job.describe()
    assert re.search(r"^tasks +2 \(2 per node\)", out, re.M), job.describe()
    assert "=== exit status 0" in out, job.describe()
    # One rank per (placeholder) GPU: Slurm gave each task its own device.
    tasks = _task_lines(out)
    assert sorted(t[0] for t in tasks) == ["0", "1"] and {t[1] for t in tasks} == {"2"}, job.describe()
    assert sorted(t[3] for t in tasks) == ["0", "1"], job.describe()

    ref, ref_out = _reference_pcg(EXAMPLE_MATRIX, rtol)
    module = re.search(r"^module +(\S+)", out, re.M).group(1)
    results = re.findall(r"^result +(converged|NOT CONVERGED.*?) in (\d+) iterations", out, re.M)
    residuals = [float(v) for v in re.findall(r"^true relative residual +(\S+)", out, re.M)]
    assert results and len(results) == len(residuals), job.describe()
    for status, iters in results:
        assert status == "converged", job.describe()
    for rr in residuals:
        assert 0 < rr <= 2 * rtol, job.describe()
    if module == "solvers.pcg":
        # Each of the two tasks ran the serial solver: same numbers as the reference run.
        assert len(results) == 2, job.describe()
        ref_line = re.search(r"^true relative residual .*$", ref_out, re.M).group(0)
        assert re.findall(r"^true relative residual .*$", out, re.M) == [ref_line] * 2, job.describe()
        assert [int(i) for _, i in results] == [ref["iterations"]] * 2, job.describe()
    else:
        # The distributed solver: one report, from rank 0, over both ranks.
        assert re.search(r"^ranks: 2\b", out, re.M), job.describe()
        assert len(results) == 1, job.describe()
        assert abs(int(results[0][1]) - ref["iterations"]) <= 3, job.describe()
