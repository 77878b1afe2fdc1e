"""Latency of the persistent PCG kernel at small n: threads a block and blocks of its grid.

Run on a GPU machine: ``python scripts/probe_grid_latency.py [--large] [--out DIR]``.
For each small matrix (random geometric graph 50k rows, power-law graph 100k
rows, 2-D Poisson 256^2) and each PCG variant, one iteration's time (while mode,
Jacobi, float64, 32 iterations a launch, the fastest of three solves of
ITERATIONS) over the threads a block of the persistent kernel (0: the solver's
choice) and the blocks of its grid (the solver's own, then fewer). ``--large``
adds Poisson 160^3 and the 27-point stencil 128^3 at the solver's own block and
grid (the large-n regression check).
Prints a markdown table as it goes and saves it under ``scripts/results/`` (or
``--out``) with the date, the GPU and the commit.
"""
import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import provenance  # noqa: E402
from probe_formats import ITERATIONS, timed_solves  # noqa: E402
import solvers.pcg.gpu as pcg_gpu  # noqa: E402
from solvers.gallery import poisson, power_law_laplacian, random_geometric_laplacian, stencil27  # noqa: E402
from solvers import kernels  # noqa: E402

SMALL = (("geometric 50k", lambda: random_geometric_laplacian(50_000)),
         ("power-law 100k", lambda: power_law_laplacian(100_000)),
         ("Poisson 256^2", lambda: poisson((256, 256))))
LARGE = (("Poisson 160^3", lambda: poisson((160, 160, 160))), ("27-point 128^3", lambda: stencil27((128, 128, 128))))


def per_iteration(A, b, variant, block, blocks):
    """Seconds an iteration (fastest of three solves of ITERATIONS), the grid used, the layout, the
    iterations; None when ``blocks`` is not below the solver's own grid."""
    g = pcg_gpu.GPUPCG(A, "jacobi", np.float64, "while", 32, False, variant, block=block or None)
    if blocks:  # before the first launch: the slots hold the solver's own grid, enough for fewer
        if blocks >= g.grid:
            return None
        g.grid = blocks
    seconds, iterations = timed_solves(g, b)
    return seconds, g.grid, g.run_block, g.describe(), iterations


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="add two large stencils (solver's block and grid)")
    ap.add_argument("--blocks", default="264,132,66", help="grids to try below the solver's own")
    ap.add_argument("--threads", default="0,256,512,1024", help="threads a block to try (0: the solver's)")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    gpu = kernels.device_name()
    commit = provenance.commit()
    stamp = provenance.stamp()
    name = f"probe_grid_latency_{stamp}_{gpu.replace(' ', '_')}_{commit}.md"
    lines = [f"# Grid latency probe, {stamp} UTC, {gpu}, commit {commit}", "",
             f"python scripts/probe_grid_latency.py {' '.join(argv if argv is not None else sys.argv[1:])}: "
             f"{ITERATIONS} iterations in while mode (32 a launch), Jacobi, float64, fastest of 3 solves.", "",
             "| matrix | variant | threads a block | blocks | us/it | iterations | layout |",
             "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)

    def save():
        provenance.save(args.out, name, "\n".join(lines) + "\n")

    fewer = [int(v) for v in args.blocks.split(",") if v]
    threads = [int(v) for v in args.threads.split(",") if v]
    cases = [(p, False) for p in SMALL] + ([(p, True) for p in LARGE] if args.large else [])
    for (label, make), large in cases:
        t0 = time.perf_counter()
        A = make()
        b = A @ np.ones(A.shape[0])
        print(f"# {label}: n {A.shape[0]:,}, nnz {A.nnz:,}, generated in {time.perf_counter() - t0:.1f} s",
              flush=True)
        variants = ("auto",) if large else ("classic", "single-reduction")
        for block in [0] if large else threads:
            for variant in variants:
                for blocks in [0] + ([] if large else fewer):
                    timed = per_iteration(A, b, variant, block, blocks)
                    if timed is None:
                        continue  # the solver's own grid is already this small
                    t, grid, run_block, layout, its = timed
                    lines.append(f"| {label} | {variant} | {run_block} | {grid} | {t * 1e6:.2f} | {its} | {layout} |")
                    print(lines[-1], flush=True)
                    save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
