"""Detect an MPI launch from the environment, without importing mpi4py.

A plain ``python -m solvers.pcg`` must not pay for (or fail on) MPI
initialisation, so the launcher's own variables decide whether a run is
distributed; :func:`check_world` later confirms them against MPI itself.
"""
import os

# (size, rank) variables per launcher, in priority order. PMIx launches (Open MPI 5
# prterun, srun --mpi=pmix) export one of these sets as well; PMIX_RANK alone
# carries no world size.
# Slurm uses the step's task count, not SLURM_NTASKS: a batch script running a
# single ``python`` inside a multi-task allocation is not a distributed launch.
_LAUNCHERS = (
    ("Open MPI", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
    ("MPICH/Hydra", "PMI_SIZE", "PMI_RANK"),
    ("Slurm", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID"),
)


def _int(name, env):
    try:
        return int(env.get(name))
    except (TypeError, ValueError):
        return None


def detect(env=None):
    """Return ``(launcher, size, rank)``, or None when not launched by MPI."""
    env = os.environ if env is None else env
    for name, size_var, rank_var in _LAUNCHERS:
        size, rank = _int(size_var, env), _int(rank_var, env)
        if size is not None and rank is not None:
            return name, size, rank
    return None


def world_size(env=None):
    """Number of ranks of this launch (1 when not launched by MPI)."""
    found = detect(env)
    return found[1] if found else 1


def several_ranks(env=None):
    """Whether this process is one of several ranks of an MPI launch."""
    return world_size(env) > 1


def rank(env=None):
    """This process's rank (0 when not launched by MPI)."""
    found = detect(env)
    return found[2] if found else 0


def check_world(comm, env=None):
    """Raise RuntimeError when MPI's world disagrees with the launcher's variables.

    The typical cause is ``srun`` without ``--mpi=pmi2``/``pmix``: every task
    sees ``SLURM_STEP_NUM_TASKS > 1`` but MPI starts it as a world of one.
    """
    found = detect(env)
    expected = found[1] if found else 1
    if comm.Get_size() != expected:
        launcher = found[0] if found else "no launcher"
        raise RuntimeError(
            f"{launcher} announced {expected} ranks but MPI sees {comm.Get_size()}: the MPI library "
            "is not wired to the launcher (with Slurm use srun --mpi=pmi2 or --mpi=pmix)")


# Variables a child job needs; Open MPI forwards only those named with -x.
FORWARDED = ("PYTHONPATH", "OMP_NUM_THREADS", "NCCL_NVLS_ENABLE", "CUDA_VISIBLE_DEVICES", "REQUIRE_GPU")


def mpiexec_command(ranks, env=None, exe="mpiexec"):
    """Command prefix starting ``ranks`` processes with the MPI launcher ``exe``.

    Open MPI refuses to run as root and drops the caller's variables unless
    told otherwise; MPICH's Hydra needs neither option.
    """
    import subprocess

    env = os.environ if env is None else env
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        forward = [a for v in FORWARDED if v in env for a in ("-x", v)]
        return [exe, "--allow-run-as-root", "--oversubscribe", *forward, "-n", str(ranks)]
    return [exe, "-n", str(ranks)]
