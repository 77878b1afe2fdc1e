"""Time one PCG iteration for every kernel configuration on the matrix classes of the benchmark.

Run on a GPU machine: ``python scripts/probe_formats.py [--quick] [--only NAME ...]``.
For each matrix: the matrix format (DIA, ELL, SELL, CSR), how the product reads the
vector it multiplies (formed on the fly or stored first), the variant, the
matrix loads' cache hint, and reverse Cuthill-McKee reordering, each timed over
a fixed number of iterations in while mode, beside one cuSPARSE SpMV and one
iteration of cupyx ``cg`` on the same matrix. Prints a markdown table and saves it
under ``scripts/results/`` with the date, the GPU and the commit; this is the
measurement ``auto``'s choices rest on (MEASUREMENTS.md).

``--sell``: the SELL path of the irregular matrices (random geometric graph 2M
rows, power-law graph 1M rows; 200k and 100k with ``--quick``). First where the
format conversion's time goes: the conversion from the device CSR arrays as the
solver's set-up does it (``choose_format`` and the values), plain, then under
cProfile (host time by function, device waits included), then with its stages
each timed between two device synchronisations (:data:`SELL_STAGES`, inclusive
and own time). Then one PCG iteration for each layout of :func:`sell_sweep`, both
variants, with the product alone (the residual kernel) beside one cuSPARSE SpMV
and one iteration of cupyx ``cg``. Saved under ``scripts/results/`` with the date,
the GPU and the commit.

``--setup``: the conversion by stages (as ``--sell`` does it) on the benchmark's
random geometric graphs of 50k, 200k and 2M rows, the power-law graph of 100k rows
and the 27-point stencil of 128^3 points, what single CuPy steps (sorts, scans,
launches, reads back) cost on 50k and 2M entries, and SELL's two row orders per
iteration on the geometric graphs of up to 200k rows. Saved like ``--sell``'s.
"""
import argparse
import cProfile
import io
import pathlib
import pstats
import shlex
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import provenance  # noqa: E402
from bench_pcg import matrix_and_rhs, with_random_solution  # noqa: E402
from probe_setup import StageTimer  # noqa: E402
from solvers import formats, kernels  # noqa: E402
from solvers.gallery import (periodic_poisson, poisson, power_law_laplacian, random_geometric_laplacian,  # noqa: E402
                             stencil27)
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
    yield "Poisson 128^3", lambda: poisson((128, 128, 128))
    yield "torus 128^3", lambda: with_random_solution(periodic_poisson((128, 128, 128)))


def sweep(A):
    """SELL with a stored gather: lanes a row and threads a block of the persistent kernel."""
    out = []
    for variant in ("classic", "single-reduction"):
        for lanes in (1, 2, 4, 8):
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
    if width <= 32:  # a stencil: DIA and ELL (auto's choices) against the other options
        return [("dia", "formed", "classic", None), ("dia", "stored", "classic", None),
                ("dia", "formed", "single-reduction", None), ("ell", "formed", "classic", False),
                ("ell", "formed", "classic", True), ("ell", "stored", "classic", None),
                ("sell", "formed", "classic", None), ("sell", "stored", "classic", None),
                ("ell", "formed", "single-reduction", None)]
    out = []
    for variant in ("classic", "single-reduction"):
        for gather in ("formed", "stored"):
            out.append(("sell", gather, variant, None))
            if width <= 1024:  # CSR gives a row to one group of lanes: hopeless on a hub row
                out.append(("csr", gather, variant, None))
    return out


def per_iteration(A, b, fmt, gather, variant, stream=None, lanes=None, block=None, rows="auto", solver=False):
    """Seconds an iteration (the fastest of three solves of ITERATIONS), the format conversion, the layout;
    with ``solver``, the set-up solver too. SELL numbers the rows as it lays them out where ``PCG`` lets it."""
    g = GPUPCG(A, "jacobi", np.float64, "while", 32, False, variant, fmt, gather, stream, lanes, block=block,
               sell_rows=rows, renumber=True)
    out = (timed_solves(g, b)[0], g.format_time, g.describe())
    return out + (g,) if solver else out


def timed_solves(g, b):
    """(seconds an iteration, iterations): the fastest of three solves of ITERATIONS by the set-up
    solver ``g`` after a warm-up (the capture)."""
    import cupy
    bd = g.check_vector(b, "b")
    g.solve(bd, None, 0.0, ITERATIONS, None, False)
    times = []
    for _ in range(3):
        cupy.cuda.Device().synchronize()
        iterations = g.solve(bd, None, 0.0, ITERATIONS, None, False)[2]
        times.append(g.last_loop_time / max(iterations, 1))  # a solve may stop early (breakdown at tiny r)
    return min(times), iterations


def results_log():
    """``(gpu, stamp, lines, say)``: the GPU's name, the UTC time, and ``say(text)``, which prints a line
    and keeps it in ``lines`` for the results file."""
    gpu = kernels.device_name()
    stamp = provenance.stamp()
    lines = []

    def say(text=""):
        print(text, flush=True)
        lines.append(text)

    return gpu, stamp, lines, say


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


#: Stages of a SELL conversion (``module:attribute``, as :class:`probe_setup.StageTimer` takes them) and the
#: stage each is called from (None: the whole conversion); stages the code does not have are left out.
SELL_STAGES = {
    "solvers.formats:choose_format": None,
    "solvers.formats:pattern_stats": "solvers.formats:choose_format",
    "solvers.formats.ell:ELL.__init__": "solvers.formats:choose_format",
    "solvers.formats.sell:SELL.__init__": "solvers.formats:choose_format",
    "solvers.formats.sell:SELL._build": "solvers.formats.sell:SELL.__init__",
    "solvers.formats.sell:LayoutBuild.run": "solvers.formats.sell:SELL._build",
    "solvers.formats.sell:SELL._lay_out": "solvers.formats.sell:SELL.__init__",
    "solvers.formats.sell:SELL._cut_pieces": "solvers.formats.sell:SELL._lay_out",
    "solvers.formats.sell:SELL._place_entries": "solvers.formats.sell:SELL._lay_out",
    "solvers.formats.base:MatrixFormat.values": None,
}


def stage_label(path):
    module_name, attribute = path.split(":")
    return attribute + f" ({module_name.rsplit('.', 1)[-1]})"  # as StageTimer labels it


def convert(indptr, indices, data):
    """The solver set-up's conversion (``GPUPCG._setup``) of device arrays: the automatic format and row order,
    then the values. ``choose_format`` is looked up at each call, so that a stage timer's wrapper is seen."""
    import cupy
    layout = formats.choose_format(indptr, indices, cupy, "auto", None, "auto", renumber=True)
    return layout, layout.values(data)


def conversion_report(A, reps, say):
    """Time the conversion of ``A`` from device arrays: plain, under cProfile, by stages."""
    import cupy
    indptr, indices = cupy.asarray(A.indptr, dtype=cupy.int32), cupy.asarray(A.indices, dtype=cupy.int32)
    data = cupy.asarray(A.data)
    sync = cupy.cuda.Device().synchronize

    def timed():
        sync()
        t0 = time.perf_counter()
        layout, _ = convert(indptr, indices, data)
        sync()
        return time.perf_counter() - t0, layout

    first, layout = timed()  # compiles the layout kernels and CuPy's own
    plain = sorted(timed()[0] for _ in range(reps))
    say(f"conversion ms: first {first * 1e3:.1f} (compiles), then {', '.join(f'{t * 1e3:.2f}' for t in plain)}; "
        f"layout: {layout.describe()}")
    say()
    profile = cProfile.Profile()
    sync()
    profile.enable()
    convert(indptr, indices, data)
    sync()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
    say("cProfile of one plain conversion, by own time (a call that waits for the device holds the wait):")
    say()
    say("```")
    for row in text.getvalue().splitlines():
        if row.strip() and not row.startswith(("   Ordered by", "   List reduced")):
            say(row.rstrip()[:170])
    say("```")
    say()
    timer = StageTimer(SELL_STAGES)
    runs = []
    try:
        for _ in range(reps):
            timer.seconds.clear()
            timer.calls.clear()
            timer.active = True
            total = timed()[0]
            timer.active = False
            runs.append((total, dict(timer.seconds), dict(timer.calls)))
    finally:
        timer.restore()
    say(f"stages, each between two synchronisations (median of {reps}; wrapped total "
        f"{1e3 * np.median([r[0] for r in runs]):.2f} ms):")
    say()
    say("| stage | calls | inclusive ms | own ms (less the stages it calls) |")
    say("|---|---|---|---|")
    for path, parent in SELL_STAGES.items():
        label = stage_label(path)
        if label not in runs[-1][1]:
            continue
        inclusive = float(np.median([r[1].get(label, 0.0) for r in runs]))
        children = [stage_label(p) for p, up in SELL_STAGES.items() if up == path]
        own = inclusive - sum(float(np.median([r[1].get(c, 0.0) for r in runs])) for c in children)
        depth = 0
        while parent:
            depth, parent = depth + 1, SELL_STAGES[parent]
        say(f"| {'. ' * depth}{label} | {runs[-1][2][label]} | {inclusive * 1e3:.2f} | {own * 1e3:.2f} |")
    say()
    return min(plain)


def primitive_costs(n, say, reps=20):
    """Median ms of the CuPy steps a conversion is made of, on arrays of ``n`` entries, each between two
    synchronisations: what one call costs with the device idle before it."""
    import cupy
    sync = cupy.cuda.Device().synchronize
    rng = cupy.random.default_rng(0)
    small = rng.integers(0, 66, n).astype(cupy.uint8)
    wide = rng.integers(0, n, n).astype(cupy.int32)
    values = cupy.arange(n, dtype=cupy.int64)
    target = cupy.empty(n)
    order, key = cupy.arange(n, dtype=cupy.int32), cupy.empty_like(wide)
    steps = {
        "argsort uint8 keys": lambda: small.argsort(),
        "argsort int32 keys": lambda: wide.argsort(),
        "argsort int32 keys, astype int32": lambda: wide.argsort().astype(cupy.int32),
        "cumsum int64": lambda: cupy.cumsum(values),
        "zeros float64": lambda: cupy.zeros(n),
        "scatter float64": lambda: target.__setitem__(wide, 1.0),
        "empty int32": lambda: cupy.empty(n, dtype=cupy.int32),
        "read one int back": lambda: int(values[-1]),
        "diff and max, read back": lambda: int(cupy.diff(wide).max()),
        "layout kernel launch (sell_cut_pieces, one piece)": lambda: formats.sell.launch(
            "sell_cut_pieces", 2, formats.sell.PIECES, longs=1, pieces=1, sliced=0, piece_length=512,
            long_start=order, row_pieces=order, piece_ptr=key, piece_row=key),
    }
    say(f"CuPy steps on {n:,} entries, ms (median of {reps}, each between synchronisations):")
    say()
    say("| step | ms |")
    say("|---|---|")
    for label, step in steps.items():
        step()
        times = []
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
        say(f"| {label} | {np.median(times) * 1e3:.3f} |")
    say()


def setup_probe(args):
    """``--setup``: the conversion's stages on the benchmark's matrices, the CuPy steps' costs, and SELL's two
    row orders per iteration on the smaller random geometric graphs; saves the results."""
    import cupy
    gpu, stamp, lines, say = results_log()

    def saved():
        text = (f"# Conversion probe, {stamp} UTC, {gpu}, commit {provenance.commit()}\n\n"
                f"`python scripts/probe_formats.py --setup`: the format conversion from device CSR arrays "
                f"(``choose_format`` and the values, as the solver's set-up times it) by stages, what CuPy's "
                f"steps cost, and PCG per iteration ({ITERATIONS} a solve, while mode, Jacobi, float64) with "
                f"SELL's rows by neighbours and by length.\n\n" + "\n".join(lines) + "\n")
        return provenance.save(args.out, f"probe_formats_setup_{stamp}_{gpu.replace(' ', '_')}_"
                                         f"{provenance.commit()}.md", text)

    for n in (50_000, 2_000_000):
        primitive_costs(n, say)
    cases = [("geometric 50k", lambda: random_geometric_laplacian(50_000)),
             ("geometric 200k", lambda: random_geometric_laplacian(200_000)),
             ("power-law 100k", lambda: power_law_laplacian(100_000)),
             ("27-point 128^3", lambda: stencil27((128, 128, 128))),
             ("geometric 2M", lambda: random_geometric_laplacian(2_000_000)),
             ("power-law 1M", lambda: power_law_laplacian(1_000_000))]
    for name, make in cases:
        if args.only and not any(o in name for o in args.only):
            continue
        A = make()
        n = A.shape[0]
        say(f"## {name} (n = {n:,}, nnz = {A.nnz:,}, longest row {int(np.diff(A.indptr).max()):,})")
        say()
        conversion_report(A, args.reps, say)
        if name.startswith("geometric") and n <= 200_000:
            b = A @ np.ones(n)
            say("| rows | variant | us/it | conversion ms | described |")
            say("|---|---|---|---|---|")
            for rows in ("neighbours", "length"):
                for variant in ("classic", "single-reduction"):
                    t, conv, layout = per_iteration(A, b, "sell", "stored", variant, rows=rows)
                    say(f"| {rows} | {variant} | {t * 1e6:.2f} | {conv * 1e3:.2f} | {layout} |")
            say()
        cupy.get_default_memory_pool().free_all_blocks()
        print(f"saved {saved()}", file=sys.stderr)
    return 0


def sell_sweep(name):
    """``(label, sell_rows, lanes, block, variants)`` timed on ``name``."""
    both = ("classic", "single-reduction")
    out = [("auto", "auto", None, None, both)]
    if name.startswith("power-law"):
        out += [("auto, blocks of 512 threads", "auto", None, 512, both[:1]),
                ("rows by length, 1 lane", "length", 1, None, both[:1]),
                ("rows by length, 4 lanes", "length", 4, None, both[:1])]
    return out


def product_time(g, reps=50):
    """Seconds of one product alone: the residual kernel r = b - A x over the solver's layout."""
    import cupy
    x, out = cupy.ones(g.n), cupy.empty(g.n)
    for _ in range(3):
        g._residual(x, out)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        g._residual(x, out)
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) * 1e-3 / reps


def sell_probe(args):
    """``--sell``: conversion stages and the per-iteration sweep on the irregular matrices; saves the results."""
    import cupy
    gpu, stamp, lines, say = results_log()

    cases = [("geometric 200k" if args.quick else "geometric 2M",
              lambda: random_geometric_laplacian(200_000 if args.quick else 2_000_000)),
             ("power-law 100k" if args.quick else "power-law 1M",
              lambda: power_law_laplacian(100_000 if args.quick else 1_000_000))]
    for name, make in cases:
        if args.only and not any(o in name for o in args.only):
            continue
        A = make()
        n = A.shape[0]
        b = A @ np.ones(n)
        say(f"## {name} (n = {n:,}, nnz = {A.nnz:,}, longest row {int(np.diff(A.indptr).max()):,})")
        say()
        conversion = conversion_report(A, args.reps, say)
        spmv, cupyx_it = peers(A, b)
        say("| layout | variant | us/it | our product us | x SpMV | cupyx / ours | conversion ms | conversion "
            "in iterations | described |")
        say("|---|---|---|---|---|---|---|---|---|")
        for label, rows, lanes, block, variants in sell_sweep(name):
            for variant in variants:
                try:
                    t, conv, layout, g = per_iteration(A, b, "sell", "stored", variant, None, lanes, block, rows,
                                                       solver=True)
                    product = product_time(g)
                except Exception as exc:  # report and go on: one failing configuration is a result too
                    say(f"| {label} | {variant} | failed: {type(exc).__name__}: {exc} | | | | | | |")
                    continue
                del g
                cupy.get_default_memory_pool().free_all_blocks()
                say(f"| {label} | {variant} | {t * 1e6:.1f} | {product * 1e6:.1f} | {t / spmv:.2f} "
                    f"| {cupyx_it / t:.2f} | {conv * 1e3:.2f} | {conv / t:.0f} | {layout} |")
        say(f"| cuSPARSE SpMV | | {spmv * 1e6:.1f} | | 1.00 | | | | |")
        say(f"| cupyx cg | | {cupyx_it * 1e6:.1f} | | {cupyx_it / spmv:.2f} | 1.00 | | | |")
        say()
        say(f"Fastest plain conversion {conversion * 1e3:.2f} ms.")
        say()
        cupy.get_default_memory_pool().free_all_blocks()
        path = save_sell(args, gpu, stamp, lines)  # after every matrix: a cut run keeps what it measured
        print(f"saved {path}", file=sys.stderr)
    return 0


def save_sell(args, gpu, stamp, lines):
    """Write ``--sell``'s results so far under ``args.out``; returns the file's path."""
    commit = provenance.commit()
    text = (f"# SELL probe, {stamp} UTC, {gpu}, commit {commit}\n\n"
            f"`python scripts/probe_formats.py {' '.join(argv_text(args))}`: the format conversion of the irregular "
            f"matrices by stages, then one PCG iteration ({ITERATIONS} a solve, while mode, Jacobi, float64) "
            f"for each layout, with the product alone, one cuSPARSE SpMV and one cupyx cg iteration.\n\n"
            + "\n".join(lines) + "\n")
    return provenance.save(args.out, f"probe_formats_sell_{stamp}_{gpu.replace(' ', '_')}_{commit}.md", text)


def argv_text(args):
    return ["--sell"] + (["--quick"] if args.quick else []) + (["--only", *args.only] if args.only else [])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", help="matrix names to run (substring match)")
    ap.add_argument("--sweep", action="store_true", help="irregular matrices only: SELL lanes, occupancy, hint")
    ap.add_argument("--rows", action="store_true", help="irregular matrices only: SELL's row orders, no reordering")
    ap.add_argument("--sell", action="store_true",
                    help="SELL on the irregular matrices: conversion stages and a per-iteration sweep (saved)")
    ap.add_argument("--setup", action="store_true",
                    help="the conversion by stages on the benchmark's matrices, CuPy steps' costs (saved)")
    ap.add_argument("--reps", type=int, default=3, help="--sell, --setup: timed conversions of each kind")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    if args.sell:
        return sell_probe(args)
    if args.setup:
        return setup_probe(args)
    rows = ["| matrix | n | nnz | sectors/nnz | order | format | gather | variant | stream | lanes | block "
            "| us/it | x SpMV | cupyx/ours | conversion ms | layout |", "|" + "---|" * 16]
    print(rows[0], flush=True)
    for name, make in matrices(args.quick):
        if args.only and not any(o in name for o in args.only):
            continue
        t0 = time.perf_counter()
        A, b = matrix_and_rhs(make)
        n = A.shape[0]
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
    gpu, stamp = kernels.device_name(), provenance.stamp()
    text = (f"# Format probe, {stamp} UTC, {gpu}, commit {provenance.commit()}\n\n"
            f"`python scripts/probe_formats.py {shlex.join(argv if argv is not None else sys.argv[1:])}`: one PCG "
            f"iteration ({ITERATIONS} a solve, while mode, Jacobi, float64) for each kernel configuration, its "
            f"conversion (the solver's first set-up of the matrix) and the layout, beside one cuSPARSE SpMV and one "
            f"iteration of cupyx `cg`.\n\n" + "\n".join(rows) + "\n")
    provenance.save(args.out, f"probe_formats_{stamp}_{gpu.replace(' ', '_')}_{provenance.commit()}.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
