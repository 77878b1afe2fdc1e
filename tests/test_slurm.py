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
JOB_TIME_LIMIT = 2  # minutes, Slurm's own limit for each test job
EXAMPLE_MATRIX = REPO / "examples" / "data" / "lap2D_5pt_n100.mtx"

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


def _which(name):
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _unavailable():
    """Why the cluster cannot run here, or None."""
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        return (f"Slurm/munge binaries not installed (missing: {', '.join(missing)}); "
                "run bash scripts/ci_slurm.sh (root) to install them")
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
        # --time: Slurm itself ends a job that hangs (e.g. in MPI_Init) before our timeout.
        cmd = ["sbatch", "--wait", "--parsable", f"--time={JOB_TIME_LIMIT}",
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


def _plain_env():
    """This process's environment without any launcher's variables (pytest may itself run in a job)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMI_", "PMIX_", "OMPI_"))}


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
    env = _plain_env()
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
    wrap = (f"srun --mpi=pmi2 --kill-on-bad-exit=1 {py} -c \"{RANK_PROBE}\"; echo ---; "
            f"srun --mpi=none {py} -c \"{RANK_PROBE}\"")
    job = _wrap_job(cluster, wrap)
    job.assert_ok()
    pmi2, plain = job.out.split("---\n")
    assert sorted(re.findall(r"rank \d of \d", pmi2)) == ["rank 0 of 2", "rank 1 of 2"], job.describe()
    assert re.findall(r"rank \d of \d", plain) == ["rank 0 of 1", "rank 0 of 1"], job.describe()


def _wrap_job(cluster, wrap):
    cmd = ["sbatch", "--wait", "--parsable", "--ntasks=2", "--job-name=mpi-probe", f"--time={JOB_TIME_LIMIT}",
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
                              cwd=REPO, env=_plain_env(), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(report.read_text()), proc.stdout


def _task_lines(out):
    return re.findall(r"^task (\d+)/(\d+) on \S+ \(local (\d+)\): CUDA_VISIBLE_DEVICES=(\S+)$", out, re.M)


@pytest.fixture(scope="module")
def pcg_reference():
    """The serial CLI's report for the example matrix at RTOL, outside Slurm."""
    return _reference_pcg(EXAMPLE_MATRIX, PCG_RTOL)


PCG_RTOL = 1e-10


@pytest.mark.parametrize("how", ["export", "environment"])
def test_pcg_sbatch_two_ranks(cluster, pcg_reference, how):
    """pcg.sbatch as shipped (2 tasks, 1 GPU each), CPU path: one distributed solve over 2 ranks.

    Parameters reach the job through ``sbatch --export`` in one case and through
    the submitting environment in the other; the default MATRIX is used.
    """
    if how == "export":
        variant = "classic"
        job = cluster.sbatch(SLURM_SCRIPTS / "pcg.sbatch",
                             f"--export=ALL,DEVICE=cpu,RTOL={PCG_RTOL},VARIANT={variant}")
    else:
        variant = "single-reduction"  # no VARIANT: the CLI's auto, which takes it for a small system
        job = cluster.sbatch(SLURM_SCRIPTS / "pcg.sbatch", env={"DEVICE": "cpu", "RTOL": str(PCG_RTOL)})
    job.assert_ok()
    out = job.out
    assert f"=== graphsolve-cuda PCG, job {job.id}" in out, job.describe()
    assert re.search(r"^tasks +2 \(2 per node\)", out, re.M), job.describe()
    assert re.search(r"^matrix +\S*/examples/data/lap2D_5pt_n100\.mtx$", out, re.M), job.describe()
    assert "=== exit status 0" in out, job.describe()
    # One rank per (placeholder) GPU: Slurm gave each task its own device.
    tasks = _task_lines(out)
    assert sorted(t[0] for t in tasks) == ["0", "1"] and {t[1] for t in tasks} == {"2"}, job.describe()
    assert sorted(t[3] for t in tasks) == ["0", "1"], job.describe()

    # One report, printed by rank 0 for the two ranks together.
    ref, _ = pcg_reference
    results = re.findall(r"^result +(converged|NOT CONVERGED.*?) in (\d+) iterations", out, re.M)
    residuals = [float(v) for v in re.findall(r"^true relative residual +(\S+)", out, re.M)]
    assert len(results) == 1 and len(residuals) == 1, job.describe()
    assert results[0][0] == "converged", job.describe()
    assert re.search(rf"^ranks +2 \(variant {variant}\)", out, re.M), job.describe()
    # The right answer: below the tolerance, and the serial solver's iteration count
    # (the distributed sums round differently, so allow a couple of iterations).
    assert 0 < residuals[0] <= 2 * PCG_RTOL, job.describe()
    assert abs(int(results[0][1]) - ref["iterations"]) <= 2, (ref["iterations"], job.describe())
    assert re.search(r"^error vs exact solution +(\S+)", out, re.M), job.describe()
    err = float(re.search(r"^error vs exact solution +(\S+)", out, re.M).group(1))
    assert err < 1e3 * PCG_RTOL, job.describe()


MD_STEPS, MD_CELLS, MD_SEED = 50, "5 5 5", 87287
THERMO_HEADER = ["Step", "Temp", "E_pair", "TotEng", "Press"]


def _thermo(lines):
    """Rows of the first LAMMPS-style thermo block in ``lines``, as dicts of floats."""
    rows, columns = [], None
    for line in lines:
        fields = line.split()
        if fields[:5] == THERMO_HEADER:
            columns = fields
            continue
        if columns and len(fields) == len(columns):
            try:
                rows.append(dict(zip(columns, map(float, fields))))
            except ValueError:
                break
        elif columns and rows:
            break
    return columns, rows


def _reference_md(seed):
    proc = subprocess.run([sys.executable, "-m", "solvers.md", "--lattice", "fcc", "--cells", *MD_CELLS.split(),
                           "--steps", str(MD_STEPS), "--device", "cpu", "--seed", str(seed)],
                          cwd=REPO, env=_plain_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return _thermo(proc.stdout.splitlines())


def test_md_sbatch_one_simulation_on_two_ranks(cluster):
    """md.sbatch as shipped with two tasks: one simulation over both ranks, the serial run's numbers."""
    job = cluster.sbatch(SLURM_SCRIPTS / "md.sbatch", "--ntasks-per-node=2",
                         env={"DEVICE": "cpu", "CELLS": MD_CELLS, "STEPS": str(MD_STEPS), "THERMO": "10",
                              "DUMP": "one.xyz", "RESTART": "one.npz"})
    job.assert_ok()
    out = job.out
    assert "=== exit status 0" in out and re.search(r"^distributed +2 ranks", out, re.M), job.describe()
    assert re.search(r"500 atoms, .* 2 ranks \(grid \d x \d x \d\)", out), job.describe()
    assert out.count("Loop time of") == 1, job.describe()
    assert re.search(rf"Loop time of \S+ on 2 procs for {MD_STEPS} steps with 500 atoms", out), job.describe()
    columns, rows = _thermo(out.splitlines())
    proc = subprocess.run([sys.executable, "-m", "solvers.md", "--lattice", "fcc", "--cells", *MD_CELLS.split(),
                           "--steps", str(MD_STEPS), "--device", "cpu", "--seed", str(MD_SEED), "--thermo", "10"],
                          cwd=REPO, env=_plain_env(), capture_output=True, text=True, timeout=120)
    ref_columns, ref_rows = _thermo(proc.stdout.splitlines())
    assert columns == ref_columns and [r["Step"] for r in rows] == [r["Step"] for r in ref_rows], job.describe()
    for got, want in zip(rows, ref_rows):
        for key in THERMO_HEADER[1:]:
            assert got[key] == pytest.approx(want[key], rel=1e-8), (key, job.describe())
    frames = (cluster.jobs / "one.xyz").read_text().count("Lattice=")
    assert frames == 1 and (cluster.jobs / "one.npz").exists(), job.describe()  # step 0 (then every 100)


def test_md_sbatch_two_replicas(cluster):
    """md.sbatch with two tasks and REPLICAS=1: two replicas (seeds 87287, 87288), thermo labelled by rank."""
    job = cluster.sbatch(SLURM_SCRIPTS / "md.sbatch", "--ntasks-per-node=2",
                         env={"DEVICE": "cpu", "CELLS": MD_CELLS, "STEPS": str(MD_STEPS),
                              "DUMP": "traj.xyz", "REPLICAS": "1"})
    job.assert_ok()
    out = job.out
    assert re.search(r"^tasks +2 \(2 per node\)", out, re.M), job.describe()
    assert "=== exit status 0" in out, job.describe()
    per_rank = {0: [], 1: []}
    for line in out.splitlines():
        m = re.match(r"^ *(\d+): ?(.*)$", line)
        if m and int(m.group(1)) in per_rank:
            per_rank[int(m.group(1))].append(m.group(2))
    for rank, lines in per_rank.items():
        text = "\n".join(lines)
        assert f"task {rank}/2 on " in text, job.describe()
        columns, rows = _thermo(lines)
        assert columns and columns[:5] == THERMO_HEADER, job.describe()
        assert [r["Step"] for r in rows][0] == 0 and rows[-1]["Step"] == MD_STEPS, job.describe()
        assert rows[0]["Temp"] == pytest.approx(1.44), job.describe()
        # NVE: total energy per atom stays put over 50 steps.
        assert abs(rows[-1]["TotEng"] - rows[0]["TotEng"]) < 0.02, job.describe()
        assert re.search(rf"Loop time of \S+ on 1 procs for {MD_STEPS} steps with 500 atoms", text), job.describe()
        # Each replica wrote its own trajectory in the submit directory.
        dump = cluster.jobs / f"traj.rank{rank}.xyz"
        assert dump.exists() and dump.read_text().split("\n", 1)[0].strip() == "500", job.describe()
    # Replica r is the serial run with seed 87287 + r, number for number.
    for rank in (0, 1):
        ref_columns, ref_rows = _reference_md(MD_SEED + rank)
        assert _thermo(per_rank[rank]) == (ref_columns, ref_rows), job.describe()
    assert per_rank[0] != per_rank[1]


def test_bench_sbatch_cpu(cluster):
    """bench.sbatch's CPU parts on 2 tasks: PCG per variant and matrix, bench_dist.py through
    srun steps of 1 and 2 ranks, MD replicas, and the summary tables."""
    job = cluster.sbatch(SLURM_SCRIPTS / "bench.sbatch", "--ntasks-per-node=2", "--cpus-per-task=1",
                         "--export=ALL,DEVICE=cpu,POISSON=16x16,BENCH=modes dist md")
    job.assert_ok()
    out = job.out
    results = cluster.jobs / f"bench-{job.id}"
    for name in ("pcg_lap2D_5pt_n100_classic.json", "pcg_poisson_16x16_single-reduction.json"):
        assert (results / name).exists(), job.describe()
    summary = (results / "summary.md").read_text()
    assert re.search(r"^\| lap2D_5pt_n100\.mtx \| 10,000 \| 2 \| cpu \| classic \| \d+ \|", summary, re.M), summary
    assert re.search(r"^\| poisson_16x16\.mtx \| 256 \| 2 \| cpu \| single-reduction \|", summary, re.M), summary
    assert len(re.findall(r"^\| 5x5x5 \| 500 \| 50 \|", summary, re.M)) == 2, summary
    dist_tables = list(results.glob("bench_dist_*.md"))
    assert len(dist_tables) == 1, job.describe()
    table = dist_tables[0].read_text()
    for gpus, variant in ((1, "classic"), (2, "classic"), (2, "single-reduction")):
        assert re.search(rf"^\| 16\^3 \| 4,096 \| {gpus} \| {variant} \|", table, re.M), table
    assert summary in out and "=== exit status 0" in out, job.describe()
