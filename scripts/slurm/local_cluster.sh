#!/usr/bin/env bash
# A private single-node Slurm cluster on this machine, for tests and for trying
# the batch scripts without a real cluster.
#
#   scripts/slurm/local_cluster.sh install   # apt-get the Debian packages if missing (root)
#   scripts/slurm/local_cluster.sh check     # exit 1 when a binary is missing
#   scripts/slurm/local_cluster.sh start     # munged + slurmctld + slurmd, wait for the node
#   scripts/slurm/local_cluster.sh status    # daemons alive? sinfo
#   scripts/slurm/local_cluster.sh env       # print the export line for the clients
#   scripts/slurm/local_cluster.sh stop      # stop the three daemons by their pid files
#
# Everything (slurm.conf, munge key and socket, spool/state dirs, logs, pid
# files) lives in one folder, GS_SLURM_DIR (default ${TMPDIR:-/tmp}/graphsolve-cuda-slurm).
# Nothing in /etc is read or written: munged gets a private key and socket
# through its options, and slurm.conf points the auth/munge plugin at that
# socket (AuthInfo=socket=...). Clients find the cluster through SLURM_CONF:
#
#   eval "$(scripts/slurm/local_cluster.sh start)"   # start prints: export SLURM_CONF=...
#   sbatch --wait scripts/slurm/pcg.sbatch
#   scripts/slurm/local_cluster.sh stop
#
# Settings (environment):
#   GS_SLURM_DIR        state folder (created; stop leaves it for the logs)
#   GS_SLURM_CPUS       CPUs the node advertises (default: nproc)
#   GS_SLURM_GPUS       fake "gpu" GRES count on the node (default 0). With N>0 the
#                       node advertises N GPUs backed by placeholder device files, so
#                       that scripts asking --gpus-per-task can be scheduled; jobs
#                       must still run on the CPU path (DEVICE=cpu).
#   GS_SLURMCTLD_PORT, GS_SLURMD_PORT   TCP ports (default: two free ones)
#   GS_SLURM_TIMEOUT    seconds to wait for the node to become idle (default 60)
#
# Runs as root (SlurmUser=root); this is what CI and the test do. The daemons
# need no systemd, no cgroups (proctrack/linuxproc, task/none).
set -euo pipefail
PATH="$PATH:/usr/sbin:/sbin"  # slurmctld, slurmd, munged live in sbin

DIR="${GS_SLURM_DIR:-${TMPDIR:-/tmp}/graphsolve-cuda-slurm}"
CONF="$DIR/slurm.conf"
MUNGE_SOCKET="$DIR/munge/munge.socket.2"
PACKAGES=(slurmctld slurmd slurm-client munge)
BINARIES=(slurmctld slurmd sbatch srun sinfo scontrol munged munge)

log() { printf 'local_cluster: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

have_binaries() {
    local b
    for b in "${BINARIES[@]}"; do
        command -v "$b" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$b" >/dev/null 2>&1 || return 1
    done
}

cmd_install() {
    # Idempotent: nothing to do when every binary is already on PATH.
    if have_binaries; then
        log "slurm and munge already installed ($(slurmctld -V 2>/dev/null || echo "?"))"
        return 0
    fi
    [ "$(id -u)" = 0 ] || die "install needs root (apt-get)"
    log "installing ${PACKAGES[*]} from Debian"
    export DEBIAN_FRONTEND=noninteractive
    # --no-install-recommends: the recommended plugin packages (hdf5, influxdb,
    # rrd, ...) triple the download and are not needed here.
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
    have_binaries || die "packages installed but binaries still missing"
    log "installed $(slurmctld -V)"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_conf() {
    local host cpus mem ctld_port slurmd_port gpus first_job_id gres_line=""
    host="$(hostname -s)"
    cpus="${GS_SLURM_CPUS:-$(nproc)}"
    # RealMemory in MB, a little under the total so slurmd never drains the node
    # for having less memory than configured.
    mem="$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)"
    ctld_port="${GS_SLURMCTLD_PORT:-$(free_port)}"
    slurmd_port="${GS_SLURMD_PORT:-$(free_port)}"
    while [ "$slurmd_port" = "$ctld_port" ]; do slurmd_port="$(free_port)"; done
    gpus="${GS_SLURM_GPUS:-0}"
    first_job_id="${GS_SLURM_FIRST_JOB_ID:-$((1000 + RANDOM * 30 + RANDOM % 30))}"

    mkdir -p "$DIR"/{state,spool,log,run,munge,gres}
    # The socket folder must be searchable by everyone or munged warns.
    chmod 711 "$DIR" "$DIR/munge"

    if [ "$gpus" -gt 0 ]; then
        # Placeholder devices: gres/gpu wants one character device per GPU to
        # hand out CUDA_VISIBLE_DEVICES indices. These are copies of /dev/null
        # (major 1, minor 3); with task/none nothing opens or constrains them.
        local i
        for ((i = 0; i < gpus; i++)); do
            rm -f "$DIR/gres/gpu$i"
            mknod -m 666 "$DIR/gres/gpu$i" c 1 3
        done
        {
            echo "AutoDetect=off"
            echo "NodeName=$host Name=gpu File=$DIR/gres/gpu[0-$((gpus - 1))]"
        } >"$DIR/gres.conf"
        gres_line="Gres=gpu:$gpus"
    else
        : >"$DIR/gres.conf"
    fi

    cat >"$CONF" <<EOF
# Written by scripts/slurm/local_cluster.sh: one node, everything under $DIR
ClusterName=graphsolve-cuda-local
# Job ids start at a random value: MPICH names its shared-memory segment
# (/dev/shm/mpich_shm_*) after the PMI job id "<job>.<step>", and a segment
# left behind by an aborted job of an earlier cluster breaks MPI_Init of a new
# job with the same id ("Message truncated" / "comm_addr_exchange").
FirstJobId=$first_job_id
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
# Daemons and jobs run as root on this throwaway machine.
SlurmUser=root
SlurmdUser=root
# Private munge daemon: key and socket in $DIR/munge, not /etc/munge.
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
# No cgroups in containers/sandboxes: track processes through /proc, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# Start batch jobs as soon as they are submitted (default: may wait up to 3 s).
SchedulerParameters=batch_sched_delay=0
# srun picks the MPI plugin from --mpi; jobs here pass --mpi=pmi2 themselves.
MpiDefault=none
ReturnToService=2
# Trust the node description below even when the hardware reports another layout.
SlurmdParameters=config_overrides
MailProg=/bin/true
InactiveLimit=0
KillWait=5
# Keep finished jobs 4 s (the least allowed is 2). Below 2x the first 2 s poll, this
# keeps "sbatch --wait" polling every 2 s instead of backing off to 8 s and 32 s.
MinJobAge=4
SlurmctldTimeout=30
SlurmdTimeout=30
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
GresTypes=gpu
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem $gres_line State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munge() {
    if pid_alive "$DIR/run/munged.pid"; then
        return 0
    fi
    if [ ! -s "$DIR/munge/munge.key" ]; then
        (umask 077 && head -c 1024 /dev/urandom >"$DIR/munge/munge.key")
    fi
    # --force: run as root and accept the temp-folder paths; all paths are private.
    munged --force \
        --key-file="$DIR/munge/munge.key" \
        --socket="$MUNGE_SOCKET" \
        --pid-file="$DIR/run/munged.pid" \
        --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munged.seed" \
        || die "munged failed to start; see $DIR/log/munged.log"
    local i
    for ((i = 0; i < 50; i++)); do
        if munge -S "$MUNGE_SOCKET" -n 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
    done
    die "munged does not answer on $MUNGE_SOCKET; see $DIR/log/munged.log"
}

node_state() {
    sinfo -h -N -o '%T' 2>/dev/null | head -n1
}

cmd_start() {
    have_binaries || die "slurm/munge binaries missing: run '$0 install' (root) first"
    PATH="$PATH:/usr/sbin:/sbin"
    if pid_alive "$DIR/run/slurmctld.pid" && pid_alive "$DIR/run/slurmd.pid"; then
        log "already running in $DIR"
    else
        write_conf
        start_munge
        export SLURM_CONF="$CONF"
        # -i: ignore (absent) saved state; both daemons fork and write their pid files.
        pid_alive "$DIR/run/slurmctld.pid" || slurmctld -i -f "$CONF" \
            || die "slurmctld failed; see $DIR/log/slurmctld.log"
        pid_alive "$DIR/run/slurmd.pid" || slurmd -f "$CONF" \
            || die "slurmd failed; see $DIR/log/slurmd.log"
    fi
    export SLURM_CONF="$CONF"
    local deadline=$((SECONDS + ${GS_SLURM_TIMEOUT:-60})) state=""
    while ((SECONDS < deadline)); do
        state="$(node_state)"
        case "$state" in
            idle | mixed | allocated) break ;;
            down* | drain* | fail*)
                scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true ;;
        esac
        sleep 0.5
    done
    case "$state" in
        idle | mixed | allocated) ;;
        *)
            log "node state '$state' after ${GS_SLURM_TIMEOUT:-60}s; last log lines:"
            tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 2>/dev/null || true
            die "cluster did not come up" ;;
    esac
    log "up: node $(hostname -s) $state, conf $CONF"
    printf 'export SLURM_CONF=%q\n' "$CONF"
}

# stop_daemons NAME...: SIGTERM each daemon by its pid file (all at once: each
# takes about 2 s to wind down), wait up to 10 s, then SIGKILL what is left.
stop_daemons() {
    local name pid i pids=()
    for name in "$@"; do
        pid="$(cat "$DIR/run/$name.pid" 2>/dev/null || true)"
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    for ((i = 0; i < 100; i++)); do
        local alive=0
        for pid in ${pids[@]+"${pids[@]}"}; do
            if kill -0 "$pid" 2>/dev/null; then alive=1; fi
        done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pid in ${pids[@]+"${pids[@]}"}; do
        if kill -0 "$pid" 2>/dev/null; then
            log "pid $pid ignored SIGTERM; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    for name in "$@"; do
        rm -f "$DIR/run/$name.pid"
    done
}

cmd_stop() {
    PATH="$PATH:/usr/sbin:/sbin"
    if [ -f "$CONF" ] && pid_alive "$DIR/run/slurmctld.pid"; then
        # Jobs of this private cluster only: cancel them so no slurmstepd stays behind.
        SLURM_CONF="$CONF" scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
        local i
        for ((i = 0; i < 20; i++)); do
            [ -z "$(SLURM_CONF="$CONF" squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.25
        done
    fi
    stop_daemons slurmd slurmctld munged
    log "stopped (state and logs kept in $DIR)"
}

cmd_status() {
    local d rc=0
    for d in munged slurmctld slurmd; do
        if pid_alive "$DIR/run/$d.pid"; then
            echo "$d: running (pid $(cat "$DIR/run/$d.pid"))"
        else
            echo "$d: stopped"
            rc=1
        fi
    done
    if [ "$rc" = 0 ]; then
        SLURM_CONF="$CONF" sinfo -N -l || rc=1
    fi
    return "$rc"
}

case "${1:-}" in
    install) cmd_install ;;
    check)
        if have_binaries; then
            echo "slurm and munge installed: $(slurmctld -V)"
        else
            echo "slurm/munge binaries missing (need: ${BINARIES[*]})" >&2
            exit 1
        fi ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) printf 'export SLURM_CONF=%q\n' "$CONF" ;;
    *)
        echo "usage: $0 install|check|start|stop|status|env   (state in GS_SLURM_DIR=$DIR)" >&2
        exit 2 ;;
esac
