"""Latency probe for the PCG while driver: time per iteration over variant, unroll and grid size.

Run on a GPU machine: ``python scripts/probe_pcg_latency.py``. Prints one line per
setting (problem, variant, unroll, blocks, iterations, us per iteration); used to
choose the defaults that ``scripts/bench_pcg.py`` then measures against the peers.
"""
import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import solvers  # noqa: E402
import solvers.pcg.gpu as pcg_gpu  # noqa: E402
from solvers.gallery import poisson  # noqa: E402


def time_per_iteration(A, b, variant, unroll, blocks, reps):
    solver = solvers.PCG(A, rtol=1e-8, device="gpu", mode="while", unroll=unroll, variant=variant, maxiter=100000)
    impl = solver._impl
    if blocks:  # fewer blocks than the default only: the partial-sum buffer is sized for the default
        impl.grid = min(blocks, impl.grid)
    solver.solve(b)
    runs = [solver.solve(b) for _ in range(reps)]
    return runs[0].iterations, float(np.median([r.loop_time for r in runs])) / runs[0].iterations, impl.grid


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="64x64,256x256,64x64x64")
    ap.add_argument("--unroll", default="4,8")
    ap.add_argument("--blocks", default="0", help="grid sizes to try (0: the default)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--run-block", type=int, nargs="+", default=[0],
                    help="threads per block of the persistent kernels (0: the solver's choice)")
    ap.add_argument("--variants", nargs="+", default=["classic", "single-reduction"])
    args = ap.parse_args(argv)
    solver_choice = pcg_gpu.run_block
    for shape in args.shapes.split(","):
        A = poisson(tuple(int(v) for v in shape.split("x")))
        b = A @ np.ones(A.shape[0])
        for variant in args.variants:
            for run_block in args.run_block:
                pcg_gpu.run_block = (lambda n, fixed=run_block: fixed) if run_block else solver_choice
                run_block = pcg_gpu.run_block(A.shape[0])
                for unroll in map(int, args.unroll.split(",")):
                    for blocks in map(int, args.blocks.split(",")):
                        its, t, grid = time_per_iteration(A, b, variant, unroll, blocks, args.reps)
                        print(f"{shape:>10} {variant:>16} unroll {unroll:2d} blocks {grid:4d}x{run_block:<4d} "
                              f"iters {its:5d} {t * 1e6:7.2f} us/it", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
