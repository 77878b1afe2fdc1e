#!/usr/bin/env bash
# One call on the GPU machine: the whole test suite with REQUIRE_GPU=1, then a benchmark.
# Usage (from the repo root, on the GPU machine): bash scripts/device_check.sh [pytest args...]
# Logs go to $OUT (or ./.out) so the caller can fetch them.
set -uo pipefail
OUT="${OUT:-.out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pytest -q -p no:cacheprovider "${@:-tests}" 2>&1 | tee "$OUT/tests.log" | tail -40
echo "tests exit: ${PIPESTATUS[0]}"
if [ -n "${BENCH:-}" ]; then
  python3 scripts/bench_pcg.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_pcg.log" | tail -30
  cp scripts/results/pcg_*.md "$OUT/" 2>/dev/null
fi
