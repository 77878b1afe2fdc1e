#!/usr/bin/env bash
# `mpiexec -n N CMD...` done by srun inside a Slurm allocation, for tools that
# start their own MPI jobs through an mpiexec-like command (scripts/bench_dist.py
# --mpiexec, GRAPHSOLVE_MPIEXEC). Each call becomes one job step of N tasks,
# one GPU each when the job asked --gpus-per-task, bound by task.sh.
#
#   scripts/slurm/srun_mpiexec.sh --version
#   scripts/slurm/srun_mpiexec.sh -n 2 python script.py
#
# The mpich wheel's own mpiexec (Hydra) also runs inside an allocation (seen on
# one node: its ranks see all the job's GPUs and the solver picks one by local
# rank). Going through srun instead makes every call a Slurm step: tasks placed
# as the allocation says across nodes, one GPU each from Slurm, accounting, and
# the whole step ended when one rank fails.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in
    --version)
        echo "srun_mpiexec (srun --mpi=${SRUN_MPI:-pmi2}; $(srun --version 2>/dev/null || echo 'srun missing'))"
        exit 0 ;;
    -n | -np)
        [ $# -ge 3 ] || { echo "usage: $0 -n N CMD..." >&2; exit 2; }
        ntasks="$2"
        shift 2 ;;
    *)
        echo "usage: $0 -n N CMD...   (or --version)" >&2
        exit 2 ;;
esac

# --kill-on-bad-exit: one failing rank ends the step instead of leaving the
# others blocked in a collective.
# shellcheck disable=SC2086 # SRUN_ARGS is a list of options on purpose
exec srun --mpi="${SRUN_MPI:-pmi2}" --ntasks="$ntasks" --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
    "$here/task.sh" "$@"
