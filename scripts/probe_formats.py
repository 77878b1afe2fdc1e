"""Time one PCG iteration for every kernel configuration on the matrix classes of the benchmark.

Run on a GPU machine: ``python scripts/probe_formats.py [--quick] [--only NAME ...]``.
For each matrix: the matrix format (ELL, SELL, CSR), how the product reads the
vector it multiplies (formed on the fly or stored first), the variant, the
matrix loads' cache hint, and reverse Cuthill-McKee reordering, each timed over
a fixed number of iterations in while mode, beside one cuSPARSE SpMV and one
iteration of cupyx ``cg`` on the same matrix. Prints a markdown table; this is
the measurement ``auto``'s choices rest on (MEASUREMENTS.md).
"""
import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from solvers.gallery import poisson, power_law_laplacian, random_geometric_laplacian, stencil27  # noqa: E402
from solvers.pcg.gpu import GPUPCG  # noqa: E402
from solvers.reorder import choose_reordering, gather_sectors  # noqa: E402

ITERATIONS = 200


def matrices(quick):
    yield "geometric 50k", lambda: random_geometric_laplacian(50_000)
    yield "power-law 100k", lambda: power_law_laplacian(100_000)
    if quick:
        return
    yield "geometric 2M", lambda: random_geometric_laplacian(2_000_000)
    yield "power-law 1M", lambda: power_law_laplacian(1_000_000)
    yield "27-point 128^3", lambda: stencil27((128, 128, 128))
    yield "Poisson 160^3", lambda: poisson((160, 160, 160))


def sweep(A):
    """SELL with a stored gather: lanes a row and threads a block of the persistent kernel."""
    out = []
    for variant in ("classic", "single-reduction"):
        for lanes in (2, 4, 8):
            for block in (256, 512, 1024):
                out.append(("sell", "stored", variant, None, lanes, block))
    return out


def row_orders():
    """SELL with a stored gather in both row orders, both variants."""
    return [("sell", "stored", variant, None, None, None, rows) for variant in ("classic", "single-reduction")
            for rows in ("neighbours", "length")]


def configs(A):
    """(format, gather, variant, stream) tuples worth timing on A."""
    width = int(np.diff(A.indptr).max())
    if width <= 32:  # a stencil: ELL as today against the new options
        return [("ell", "formed", "classic", False), ("ell", "formed", "classic", True),
                ("ell", "stored", "classic", None), ("sell", "formed", "classic", None),
                ("sell", "stored", "classic", None), ("ell", "formed", "single-reduction", None)]
    out = []
    for variant in ("classic", "single-reduction"):
        for gather in ("formed", "stored"):
            out.append(("sell", gather, variant, None))
            if width <= 1024:  # CSR gives a row to one group of lanes: hopeless on a hub row
                out.append(("csr", gather, variant, None))
    return out


def per_iteration(A, b, fmt, gather, variant, stream=None, lanes=None, block=None, rows="auto"):
    import cupy
    g = GPUPCG(A, "jacobi", np.float64, "while", 32, False, variant, fmt, gather, stream, lanes, block=block,
               sell_rows=rows)
    bd = g.check_vector(b, "b")
    g.solve(bd, None, 0.0, ITERATIONS, None, False)  # warm-up: capture
    times = []
    for _ in range(3):
        cupy.cuda.Device().synchronize()
        g.solve(bd, None, 0.0, ITERATIONS, None, False)
        times.append(g.last_loop_time / ITERATIONS)
    return min(times), g.format_time, g.describe()


def peers(A, b):
    import cupy
    import cupyx.scipy.sparse as csp
    import cupyx.scipy.sparse.linalg as cla
    Ad, bd = csp.csr_matrix(A), cupy.asarray(b)
    for _ in range(3):
        Ad @ bd
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(50):
        Ad @ bd
    end.record()
    end.synchronize()
    spmv = cupy.cuda.get_elapsed_time(start, end) * 1e-3 / 50
    cla.cg(Ad, bd, rtol=1e-300, atol=0.0, maxiter=20)
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    cla.cg(Ad, bd, rtol=1e-300, atol=0.0, maxiter=100)
    cupy.cuda.Device().synchronize()
    return spmv, (time.perf_counter() - t0) / 100


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", help="matrix names to run (substring match)")
    ap.add_argument("--sweep", action="store_true", help="irregular matrices only: SELL lanes, occupancy, hint")
    ap.add_argument("--rows", action="store_true", help="irregular matrices only: SELL's row orders, no reordering")
    args = ap.parse_args(argv)
    rows = ["| matrix | n | nnz | sectors/nnz | order | format | gather | variant | stream | lanes | block "
            "| us/it | x SpMV | cupyx/ours | conversion ms | layout |", "|" + "---|" * 16]
    print(rows[0], flush=True)
    for name, make in matrices(args.quick):
        if args.only and not any(o in name for o in args.only):
            continue
        t0 = time.perf_counter()
        A = make()
        n = A.shape[0]
        b = A @ np.ones(n)
        print(f"# {name}: generated in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        spmv, cupyx_it = peers(A, b)
        if (args.sweep or args.rows) and np.diff(A.indptr).max() <= 32:
            continue
        orders = [("given", A, 0.0)]
        if (not (args.sweep or args.rows) and n <= 2_100_000 and np.diff(A.indptr).max() <= 1024
                and gather_sectors(A.indptr, A.indices) > 0.4):
            order, _ = choose_reordering(A, "rcm", "gpu")
            t1 = time.perf_counter()
            B = order.matrix(A)
            orders.append((f"rcm {order.seconds + time.perf_counter() - t1:.3f} s", B, order.seconds))
        for label, M, _ in orders:
            sectors = gather_sectors(M.indptr, M.indices)
            chosen = sweep(M) if args.sweep else row_orders() if args.rows else [c + (None, None) for c in configs(M)]
            for config in chosen:
                fmt, gather, variant, stream, lanes, block = config[:6]
                if label != "given" and (variant != "classic" or stream):
                    continue
                try:
                    t, conv, layout = per_iteration(M, b, *config)
                except Exception as exc:  # report and go on: one failing configuration is a result too
                    print(f"| {name} | {config} | failed: {type(exc).__name__}: {exc} |", file=sys.stderr, flush=True)
                    continue
                row = (f"| {name} | {n:,} | {A.nnz:,} | {sectors:.2f} | {label} | {fmt} | {gather} | {variant} "
                       f"| {stream} | {lanes} | {block} | {t * 1e6:.1f} | {t / spmv:.2f} "
                       f"| {cupyx_it / t:.1f} | {conv * 1e3:.1f} | {layout} |")
                rows.append(row)
                print(row, flush=True)
        print(f"| {name} | cuSPARSE SpMV {spmv * 1e6:.1f} us, cupyx cg {cupyx_it * 1e6:.1f} us/it |", flush=True)
        rows.append(f"| {name} | {n:,} | {A.nnz:,} | | | cuSPARSE SpMV | | | | | | {spmv * 1e6:.1f} | 1.00 "
                    "| | | |")
        rows.append(f"| {name} | {n:,} | {A.nnz:,} | | | cupyx cg | | | | | | {cupyx_it * 1e6:.1f} | "
                    f"{cupyx_it / spmv:.2f} | 1.0 | | |")
        import cupy
        cupy.get_default_memory_pool().free_all_blocks()
    print("\n" + "\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
