#!/usr/bin/env bash
# CI helper: make the Slurm test (tests/test_slurm.py) runnable on a fresh
# Debian machine, as root. Idempotent and quick when everything is there: it
# calls apt-get only for what is missing, in one go.
#
#   bash scripts/ci_slurm.sh        # then run pytest with REQUIRE_SLURM=1
#
# Installs Debian's slurmctld, slurmd, slurm-client and munge (the cluster the
# test starts with scripts/slurm/local_cluster.sh) and shellcheck (the static
# check of the batch scripts). The test starts and stops its own private
# cluster; this script leaves nothing running.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
scripts/slurm/local_cluster.sh check >/dev/null 2>&1 || need+=(slurmctld slurmd slurm-client munge)
command -v shellcheck >/dev/null 2>&1 || need+=(shellcheck)
if [ "${#need[@]}" -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "ci_slurm: missing ${need[*]} and not root: cannot install" >&2
        exit 1
    fi
    echo "ci_slurm: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # --no-install-recommends: Slurm recommends a dozen plugin packages (hdf5,
    # influxdb, rrd, ...) that the test never loads.
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
scripts/slurm/local_cluster.sh check >&2
echo "ci_slurm: $(shellcheck --version | sed -n 's/^version: /shellcheck /p')" >&2
