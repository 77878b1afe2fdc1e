# shellcheck shell=bash
# Sourced by pcg.sbatch, md.sbatch and bench.sbatch after they have found the
# repository (GS_ROOT). Sets the run environment and defines gs_srun.
# Bash only; the callers run with `set -euo pipefail`.

# --- Python ------------------------------------------------------------------
# The interpreter that has graphsolve-cuda's dependencies (numpy, scipy, mpi4py,
# cupy). sbatch passes the submitting shell's environment on (--export=ALL is
# the default), so an activated venv or conda env is found through PATH;
# PYTHON=/path/to/venv/bin/python pins one explicitly.
PYTHON="${PYTHON:-python3}"
# The job keeps Slurm's working directory, the submit directory, so relative
# paths in MATRIX, DUMP, PCG_ARGS, ... mean what they meant where sbatch was
# typed; PYTHONPATH lets `python -m solvers.pcg` import this checkout from there.
export PYTHONPATH="$GS_ROOT${PYTHONPATH:+:$PYTHONPATH}"

# --- Device ------------------------------------------------------------------
# gpu (default): fail at once when no GPU is usable; cpu: NumPy/SciPy path,
# no GPU needed (what the local test cluster runs); auto: GPU when usable.
export DEVICE="${DEVICE:-gpu}"

# --- CuPy kernel cache on node-local storage -----------------------------------
# CuPy compiles every kernel once and caches the binary (default ~/.cupy, which
# on clusters is usually NFS/Lustre: slow, shared by all nodes of all jobs,
# with unreliable locking). Node-local scratch avoids that: each node compiles
# once per job at worst. SLURM_TMPDIR is the per-job scratch folder on sites
# that define it; plain /tmp otherwise (node-local everywhere we know of).
export CUPY_CACHE_DIR="${CUPY_CACHE_DIR:-${SLURM_TMPDIR:-/tmp}/cupy-kernel-cache-$(id -un)}"

# --- NCCL (GPU-to-GPU reductions between ranks) --------------------------------
# NVLink SHARP / multicast ("NVLS") stays off. On the shared H200 NVLink hosts
# this project runs on, a program that uses NVLink multicast can put the host's
# GPUs out of service for everyone for a long time; and the solvers' allreduces
# (a few doubles per iteration, latency-bound) gain nothing from it anyway.
# Override only on a machine of your own where NVLS is known to be safe.
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
# WARN prints only problems; NCCL_DEBUG=INFO shows the rings/channels and the
# transport chosen (NVLink P2P, shared memory, IB, sockets) once per communicator.
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# Multi-node only, site-specific, left to the environment:
#   NCCL_SOCKET_IFNAME=ib0   interface for NCCL's bootstrap/socket traffic
#   NCCL_IB_HCA=mlx5_0       which InfiniBand adapters to use

# --- MPI -----------------------------------------------------------------------
# srun is the launcher: it starts the ranks and, through its PMI plugin, tells
# each one its rank and the size of the job. SRUN_MPI picks that plugin:
#   pmi2 (default): for MPICH, including the PyPI `mpich` wheel (the `mpi`
#        extra). slurmstepd's mpi/pmi2 plugin hands every task a socket as
#        PMI_FD (plus PMI_RANK, PMI_SIZE, PMI_JOBID); the wheel's libmpi.so.12
#        carries its own PMI client and talks PMI-1 over that socket: no libpmi
#        or libpmi2 from Slurm is needed. Leave MPIR_CVAR_PMI_VERSION unset
#        (=1): forcing 2 makes MPI_Init fail under Slurm 22.05.
#   pmix: for Open MPI builds (mpi4py compiled against Open MPI) on sites whose
#        Slurm has PMIx; not for the mpich wheel.
#   none: plain srun without PMI starts N independent 1-rank MPI worlds.
SRUN_MPI="${SRUN_MPI:-pmi2}"
# One rank per GPU drives the GPU from one host thread; keep the CPU libraries
# (OpenBLAS/MKL used by NumPy/SciPy on the CPU path) to the cores Slurm gave the
# task, or N ranks x all-cores threads oversubscribe the node.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-$OMP_NUM_THREADS}"
export MKL_NUM_THREADS="${MKL_NUM_THREADS:-$OMP_NUM_THREADS}"

# --- Data ----------------------------------------------------------------------
# The shared test data lives outside the repository; GRAPHSOLVE_DATA wins,
# then ./shared/data, then ../shared/data (the CI layout).
gs_data_dir() {
    local d
    for d in "${GRAPHSOLVE_DATA:-}" "$GS_ROOT/shared/data" "$GS_ROOT/../shared/data"; do
        if [ -n "$d" ] && [ -d "$d/matrices" ]; then
            (cd "$d" && pwd)
            return 0
        fi
    done
    echo "$GS_ROOT/shared/data"
}

# gs_resolve PATH: an input file; a relative path means relative to the submit
# directory when it exists there, else to the repository (the defaults, such as
# examples/data/lap2D_5pt_n100.mtx, are repository paths).
gs_resolve() {
    case "$1" in
        /*) echo "$1" ;;
        *) if [ -e "${SLURM_SUBMIT_DIR:-/nonexistent}/$1" ]; then
               echo "$SLURM_SUBMIT_DIR/$1"
           else
               echo "$GS_ROOT/$1"
           fi ;;
    esac
}

# --- Launch --------------------------------------------------------------------
# gs_srun CMD...: one task per rank as allocated (sbatch's --nodes,
# --ntasks-per-node), each through task.sh (GPU binding by local rank).
#   --kill-on-bad-exit=1: when one rank dies, kill the others instead of
#       leaving them blocked in a collective until the time limit.
#   SRUN_ARGS: extra srun options, e.g. "--label" to prefix lines by rank.
gs_srun() {
    # shellcheck disable=SC2086 # SRUN_ARGS is a list of options on purpose
    srun --mpi="$SRUN_MPI" --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
        "$GS_ROOT/scripts/slurm/task.sh" "$@"
}

# One block at the top of the job's output: what ran where.
gs_header() {
    local rev
    rev="$(git -C "$GS_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "=== graphsolve-cuda $1, job ${SLURM_JOB_ID:-none} ($(date -u '+%Y-%m-%d %H:%M:%S UTC'))"
    echo "repo           $GS_ROOT @ $rev"
    echo "nodes          ${SLURM_JOB_NUM_NODES:-1} (${SLURM_JOB_NODELIST:-$(hostname -s)})"
    echo "tasks          ${SLURM_NTASKS:-1} (${SLURM_NTASKS_PER_NODE:-?} per node), ${SLURM_CPUS_PER_TASK:-1} CPU(s) each"
    echo "gpus per task  ${SLURM_GPUS_PER_TASK:-none requested}; job CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}"
    echo "device         $DEVICE"
    echo "srun --mpi     $SRUN_MPI"
    echo "python         $("$PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    echo "CUPY_CACHE_DIR $CUPY_CACHE_DIR"
    echo "NCCL           NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE NCCL_DEBUG=$NCCL_DEBUG"
}
