#!/usr/bin/env bash
# One call on the GPU machine: every GPU test (REQUIRE_GPU=1), then, with BENCH=1, a benchmark.
# Usage (from the repo root, on the GPU machine): bash scripts/device_check.sh [pytest args...]
# With pytest args that name tests (a path or a node id), runs just those. Without, or with options
# only (`-rs`, `-x`: added to the run, not a selection of every test, CPU ones too), runs the tests
# marked `gpu`: split over two GPUs when the machine has two (one pytest process a GPU, about half the
# time), then the two-GPU MPI suites.
# Wheels in .whl/ (PyAMG, hypothesis: a GPU machine without a package index) are installed first,
# with the same Python that runs the tests. Logs go to $OUT (or ./.out) so the caller can fetch them.
set -uo pipefail
OUT="${OUT:-.out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # GPU machines often run commands as root
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install --no-deps .whl/*.whl > "$OUT/pip.log" 2>&1 || echo "wheel install failed: see pip.log"
else
  echo "no wheels in .whl/ (carry it): tests needing PyAMG or hypothesis skip where the machine lacks them"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
gpus=$(wc -l < "$OUT/gpu.txt")
pytest=(python3 -m pytest -q -p no:cacheprovider --tb=short)
named=0
for arg in "$@"; do [ -e "${arg%%::*}" ] && named=1; done
if [ "$named" = 0 ]; then pytest+=("$@"); set --; fi
if [ $# -gt 0 ]; then
  "${pytest[@]}" "$@" 2>&1 | tee "$OUT/tests.log" | tail -40
  echo "tests exit: ${PIPESTATUS[0]}"
elif [ "$gpus" -ge 2 ]; then
  two_gpu=(tests/test_dist_gpu.py tests/test_md_gpu_parallel.py)
  first=(tests/test_pcg_gpu.py tests/test_precond_device.py tests/test_amg_gpu_setup.py tests/test_formats.py
         tests/test_preconditioners.py tests/test_pcg_cli.py)
  ignored=()
  for f in "${first[@]}" "${two_gpu[@]}"; do ignored+=(--ignore="$f"); done
  CUDA_VISIBLE_DEVICES=0 "${pytest[@]}" -m gpu "${first[@]}" > "$OUT/tests_gpu0.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 "${pytest[@]}" -m gpu tests "${ignored[@]}" > "$OUT/tests_gpu1.log" 2>&1 &
  wait
  REQUIRE_MULTI_GPU=1 REQUIRE_MPI=1 "${pytest[@]}" "${two_gpu[@]}" > "$OUT/tests_two_gpus.log" 2>&1
  for log in tests_gpu0 tests_gpu1 tests_two_gpus; do echo "== $log"; tail -15 "$OUT/$log.log"; done
else
  "${pytest[@]}" -m gpu tests 2>&1 | tee "$OUT/tests.log" | tail -40
  echo "tests exit: ${PIPESTATUS[0]}"
fi
if [ -n "${BENCH:-}" ]; then
  # shellcheck disable=SC2086  # BENCH_ARGS holds several words
  python3 scripts/bench_pcg.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_pcg.log" | tail -30
  cp scripts/results/pcg_*.md "$OUT/" 2>/dev/null
fi
