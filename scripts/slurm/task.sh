#!/usr/bin/env bash
# Per-task wrapper: srun starts one copy of this per MPI rank; it picks the
# rank's GPU, prepares the node-local kernel cache, prints one line saying so,
# then execs the command ("$@") in place, so the rank's exit status, signals
# and PMI connection (PMI_FD, inherited from slurmstepd) pass straight through.
#
# GPU choice, one GPU per rank:
#   * DEVICE=cpu: nothing to bind; CUDA_VISIBLE_DEVICES is left as Slurm set it.
#   * Slurm already narrowed the task to one GPU (--gpus-per-task=1, or
#     --gpu-bind=single:1 / map_gpu): CUDA_VISIBLE_DEVICES holds one entry; keep it.
#   * The task sees several GPUs (--gpus-per-node=G without --gpus-per-task, or
#     a site whose GPUs are not Slurm GRES at all): take entry
#     SLURM_LOCALID mod G of the visible list (or device SLURM_LOCALID mod
#     GPUS_PER_NODE when CUDA_VISIBLE_DEVICES is unset), so local rank i gets
#     the i-th GPU of its node. SLURM_LOCALID is the rank within the node.
# Set GPU_BIND=none to skip all of this.
set -euo pipefail

# Rank, rank count and rank within the node, from srun, else from mpiexec
# (MPICH's Hydra: PMI_*, MPI_LOCALRANKID; Open MPI: OMPI_COMM_WORLD_*), so the
# wrapper works the same under `mpiexec -n N scripts/slurm/task.sh python ...`.
rank="${SLURM_PROCID:-${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}}"
ntasks="${SLURM_STEP_NUM_TASKS:-${PMI_SIZE:-${OMPI_COMM_WORLD_SIZE:-1}}}"
local_id="${SLURM_LOCALID:-${MPI_LOCALRANKID:-${OMPI_COMM_WORLD_LOCAL_RANK:-0}}}"

if [ "${DEVICE:-gpu}" != cpu ] && [ "${GPU_BIND:-auto}" != none ]; then
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
        if [ "${#visible[@]}" -gt 1 ]; then
            export CUDA_VISIBLE_DEVICES="${visible[$((local_id % ${#visible[@]}))]}"
        fi
    elif [ -n "${GPUS_PER_NODE:-}" ]; then
        export CUDA_VISIBLE_DEVICES="$((local_id % GPUS_PER_NODE))"
    else
        export CUDA_VISIBLE_DEVICES="$local_id"
    fi
fi

# CuPy compiles kernels at first use and keeps the binaries in CUPY_CACHE_DIR.
# The batch script points it at node-local storage; make sure it exists on
# every node (the batch script itself only runs on the first one).
if [ -n "${CUPY_CACHE_DIR:-}" ]; then
    mkdir -p "$CUPY_CACHE_DIR" 2>/dev/null || true
fi

printf 'task %s/%s on %s (local %s): CUDA_VISIBLE_DEVICES=%s\n' \
    "$rank" "$ntasks" "$(hostname -s)" "$local_id" "${CUDA_VISIBLE_DEVICES:-unset}"

exec "$@"
