"""What reverse Cuthill-McKee on the GPU costs and what it buys a PCG iteration, beside SciPy's, cuSPARSE and cupyx.

Run on a GPU machine: ``python scripts/probe_reorder.py [--only NAME ...] [--out DIR]``.
For each matrix (random numbering as generated): the GPU ordering (its levels
and passes) and the permutation of A on the GPU, each the best of three after a
warm-up; SciPy's ordering on the host (not for a matrix with a hub row, where it
takes minutes); the 32-byte sectors a nonzero the product reads as numbered and
reordered (``solvers.reorder.gather_sectors``); PCG microseconds an iteration
(while mode, Jacobi, float64, 200 iterations that do not stop, the faster
variant) as numbered and reordered; one cuSPARSE SpMV and one iteration of
cupyx ``cg`` as numbered; and what ``reorder="auto"`` does with the matrix in a
solver's set-up, with its ``reorder_time``. These are the measurements of the
cost model in ``solvers/reorder.py``. Prints a markdown table and saves it
under ``--out`` (``scripts/results/``) with the date, the GPU and the commit.

``--row-orders`` instead compares, on the random geometric graphs of 500k and 2M rows, PCG as
numbered with PCG on the matrix renumbered (a symmetric permutation, vectors included) by SELL's
neighbours' order (``SELL._neighbour_order``'s passes, as the format computes it for its rows) after
two and after four passes, and by our reverse Cuthill-McKee: what each ordering and the permutation
of A cost, the sectors a nonzero, and us an iteration.

``--numbered`` instead measures SELL's own numbering (``GPUPCG(..., renumber=True)``, what
``reorder="auto"`` gets) on the random geometric graphs of 50k, 500k and 2M rows and the power-law
graphs of 100k and 1M rows: PCG us an iteration (each variant) and the format's conversion (the
best of three set-ups) as numbered and numbered by the layout after 2, 3 and 4 passes of the
neighbours' order (``SELL.NEIGHBOUR_PASSES``).

``--deferred`` instead takes ``reorder="auto"``'s deferred reordering apart on
the random geometric graphs of 500k and 2M rows: set-up as numbered and with the plan (alternating,
best of three), what falling due costs (ordering and counting, permuting A,
setting the solver up again, the first reordered solve's capture), and the
iterations of a solve due at several points against one as numbered.
"""
import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import provenance  # noqa: E402
import solvers  # noqa: E402
from solvers import kernels  # noqa: E402
from probe_formats import ITERATIONS, peers, per_iteration  # noqa: E402
from solvers.gallery import power_law_laplacian, random_geometric_laplacian  # noqa: E402
from solvers.reorder import choose_reordering, gather_sectors  # noqa: E402

REPEATS = 3


def matrices():
    yield "geometric 50k", lambda: random_geometric_laplacian(50_000)
    yield "geometric 500k", lambda: random_geometric_laplacian(500_000)
    yield "geometric 2M", lambda: random_geometric_laplacian(2_000_000)
    yield "power-law 1M", lambda: power_law_laplacian(1_000_000)


def best_of(fn):
    """The least time of ``REPEATS`` calls after one warm-up, and the last result."""
    import cupy
    out, times = fn(), []
    for _ in range(REPEATS):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        out = fn()
        cupy.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    return min(times), out


def best_iteration(M, b):
    """PCG seconds an iteration on ``M`` (the faster variant, automatic format) and the format it took."""
    timed = [per_iteration(M, b, "auto", "auto", variant) for variant in ("classic", "single-reduction")]
    t, _, layout = min(timed, key=lambda r: r[0])
    return t, layout


def probe(name, A):
    import cupy
    import cupyx.scipy.sparse as csp
    n, nnz = A.shape[0], A.nnz
    b = A @ np.ones(n)
    Ad = csp.csr_matrix(A)
    longest = int(np.diff(A.indptr).max())
    orders = [choose_reordering(Ad, "rcm", "gpu")[0] for _ in range(1 + REPEATS)]  # the first compiles
    order, order_s = orders[-1], min(o.seconds for o in orders[1:])  # the ordering's own clock
    permute_s, B = best_of(lambda: order.matrix(Ad))
    scipy_s = None
    if longest <= 1024:  # SciPy orders a hub's neighbours by degree one by one: minutes for 1M rows
        t0 = time.perf_counter()
        choose_reordering(A, "rcm", "cpu")
        scipy_s = time.perf_counter() - t0
    before, after = gather_sectors(Ad.indptr, Ad.indices), gather_sectors(B.indptr, B.indices)
    given_it, given_layout = best_iteration(A, b)
    rcm_it, rcm_layout = best_iteration(B, order.forward(cupy.asarray(b)))
    spmv, cupyx_it = peers(A, b)
    solver = solvers.PCG(A, device="gpu", mode="while", rtol=1e-8)
    saved = given_it - rcm_it
    pays = f"{(order_s + permute_s) / saved:,.0f}" if saved > 0 else "never"
    row = (f"| {name} | {n:,} | {nnz:,} | {longest:,} | {order_s * 1e3:.1f} | {order.levels:,} / {order.passes} "
           f"| {permute_s * 1e3:.1f} | {'-' if scipy_s is None else f'{scipy_s * 1e3:.0f}'} "
           f"| {before:.2f} -> {after:.2f} | {given_it * 1e6:.1f} | {rcm_it * 1e6:.1f} | {spmv * 1e6:.1f} "
           f"| {cupyx_it * 1e6:.1f} | {given_it / spmv:.2f} / {rcm_it / spmv:.2f} "
           f"| {cupyx_it / given_it:.1f}x / {cupyx_it / rcm_it:.1f}x | {pays} | {solver.reordering} "
           f"| {solver.reorder_time * 1e3:.1f} |")
    layouts = f"{name}: as numbered {given_layout}; reordered {rcm_layout}"
    return row, layouts


def deferred(A, fractions=(0.2, 0.5, 0.8)):
    """Markdown lines: what the deferred reordering of ``A`` costs, part by part, and its restarts."""
    import cupy
    b = np.random.default_rng(4).standard_normal(A.shape[0])

    def set_up(choice):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        solver = solvers.PCG(A, device="gpu", rtol=1e-8, reorder=choice)
        cupy.cuda.Device().synchronize()
        return time.perf_counter() - t0, solver

    setups = {"none": [], "auto": []}
    for _ in range(REPEATS):
        for choice in setups:
            setups[choice].append(set_up(choice)[0])
    _, solver = set_up("auto")
    plan = solver._plan
    lines = [f"plan: {plan.note}", "",
             f"set-up ms, best of {REPEATS}: as numbered {min(setups['none']) * 1e3:.1f}, "
             f"with the plan {min(setups['auto']) * 1e3:.1f}", ""]
    tol = 1e-8 * float(np.linalg.norm(b))
    for round_ in ("cold", "warm"):  # the first round compiles and loads what the reordered solver needs
        parts = []

        def timed(label, fn):
            cupy.cuda.Device().synchronize()
            t0 = time.perf_counter()
            out = fn()
            cupy.cuda.Device().synchronize()
            parts.append(f"{label} {(time.perf_counter() - t0) * 1e3:.1f}")
            return out

        order, note = timed("ordering and counting", plan.order)
        permuted = timed("permuting A", lambda: order.matrix(plan.A))
        rebuilt = timed("setting the solver up again", lambda: solver._rebuild(permuted, order))
        rebuilt.solve(order.forward(cupy.asarray(b)), None, tol, 10**6, None, False)
        parts.append(f"first reordered solve's capture {rebuilt.last_capture_time * 1e3:.1f}")
        lines += [f"falling due ({round_}), ms: " + ", ".join(parts) + f" ({note}; model: {plan.cost * 1e3:.1f} ms)",
                  ""]
    plain = solvers.PCG(A, device="gpu", rtol=1e-8, reorder="none").solve(b)
    lines += ["| due after | iterations | as numbered | solve ms (set-up excluded) | as numbered ms |",
              "|---|---|---|---|---|"]
    for due in [int(f * plain.iterations) for f in fractions]:
        _, solver = set_up("auto")
        solver._plan.left = due
        res = solver.solve(b)
        assert res.converged and solver._order is not None, solver.reordering
        lines.append(f"| {due} | {res.iterations} | {plain.iterations} | {res.solve_time * 1e3:.1f} "
                     f"| {plain.solve_time * 1e3:.1f} |")
    return lines


def row_orders(name, A):
    """Markdown rows of :func:`main`'s ``--row-orders`` table for ``A``."""
    import cupy
    import cupyx.scipy.sparse as csp

    from solvers.formats.sell import SELL
    from solvers.reorder import Reordering
    b = A @ np.ones(A.shape[0])
    Ad = csp.csr_matrix(A)
    indptr, indices = Ad.indptr.astype(cupy.int32), Ad.indices.astype(cupy.int32)
    given_it, layout = best_iteration(A, b)
    rows = [f"| {name} | as numbered | - | - | {gather_sectors(Ad.indptr, Ad.indices):.2f} | {given_it * 1e6:.1f} "
            f"| {layout} |"]

    def neighbours(passes):
        SELL.NEIGHBOUR_PASSES = passes
        try:
            f = SELL(indptr, indices, cupy, lanes=4, row_order="neighbours")
        finally:
            SELL.NEIGHBOUR_PASSES = default
        lanes = f.slice_rows.reshape(-1, 4)[:, 0]
        return Reordering(lanes[lanes >= 0], f"neighbours, {passes} passes")

    default = SELL.NEIGHBOUR_PASSES
    orderings = [(f"SELL's neighbours' order, {p} passes", lambda p=p: neighbours(p)) for p in (2, 4)]
    orderings.append(("reverse Cuthill-McKee", lambda: choose_reordering(Ad, "rcm", "gpu")[0]))
    for label, make in orderings:
        order_s, order = best_of(make)
        permute_s, B = best_of(lambda: order.matrix(Ad))
        it, layout = best_iteration(B, order.forward(cupy.asarray(b)))
        rows.append(f"| {name} | {label} | {order_s * 1e3:.1f} | {permute_s * 1e3:.1f} "
                    f"| {gather_sectors(B.indptr, B.indices):.2f} | {it * 1e6:.1f} | {layout} |")
        print(rows[-1], flush=True)
    return rows


def numbered(name, A):
    """Markdown rows of ``--numbered``'s table for ``A``."""
    import cupy

    from probe_formats import timed_solves
    from solvers.formats.sell import SELL
    from solvers.pcg.gpu import GPUPCG
    b = cupy.asarray(A @ np.ones(A.shape[0]))
    default, rows = SELL.NEIGHBOUR_PASSES, []
    for label, renumber, passes in (("as numbered", False, default), ("2 passes", True, 2), ("3 passes", True, 3),
                                    ("4 passes", True, 4)):
        SELL.NEIGHBOUR_PASSES = passes
        try:
            cells = []
            for variant in ("classic", "single-reduction"):
                set_ups = [GPUPCG(A, "jacobi", np.float64, "while", 32, False, variant, renumber=renumber)
                           for _ in range(REPEATS)]
                cells += [timed_solves(set_ups[-1], b)[0] * 1e6, min(g.format_time for g in set_ups) * 1e3]
                layout = set_ups[-1].describe()
                del set_ups
        finally:
            SELL.NEIGHBOUR_PASSES = default
        rows.append(f"| {name} | {label} | {cells[0]:.1f} | {cells[2]:.1f} | {min(cells[1], cells[3]):.2f} "
                    f"| {layout} |")
        print(rows[-1], flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="matrix names to run (substring match)")
    ap.add_argument("--deferred", action="store_true", help="auto's deferred reordering of the geometric graphs")
    ap.add_argument("--row-orders", action="store_true",
                    help="the geometric graphs renumbered by SELL's neighbours' order against RCM")
    ap.add_argument("--numbered", action="store_true", help="SELL's own numbering by passes, and its set-up")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    import cupy
    if args.numbered:
        rows = ["| matrix | numbering | classic us/it | single-reduction us/it | format ms | format |",
                "|---|---|---|---|---|---|"]
        for name, make in [*matrices(), ("power-law 100k", lambda: power_law_laplacian(100_000))]:
            if args.only and not any(o in name for o in args.only):
                continue
            rows += numbered(name, make())
            cupy.get_default_memory_pool().free_all_blocks()
        return save(args.out, "probe_numbered", "SELL's own numbering of the rows, by passes",
                    f"PCG: while mode, Jacobi, float64, {ITERATIONS} iterations that do not stop (the fastest of "
                    f"three solves), automatic format; the conversion the best of {REPEATS} set-ups.\n\n"
                    + "\n".join(rows))
    if args.deferred:
        return save_deferred(args.out)
    if args.row_orders:
        header = ("| matrix | numbering | ordering ms | permute A ms | sectors a nonzero | PCG us/it | format |\n"
                  "|---|---|---|---|---|---|---|")
        rows = [header]
        for name, make in list(matrices())[1:3]:
            rows += row_orders(name, make())
            cupy.get_default_memory_pool().free_all_blocks()
        return save(args.out, "probe_row_orders", "Renumbering by SELL's neighbours' order against RCM",
                    f"PCG: while mode, Jacobi, float64, {ITERATIONS} iterations that do not stop, the faster "
                    f"variant, automatic format; the ordering (with the SELL layout it comes from) and the "
                    f"permutation the best of {REPEATS} after a warm-up.\n\n" + "\n".join(rows))
    header = ("| matrix | n | nnz | longest row | GPU RCM ms | levels / passes | permute A ms | SciPy RCM ms "
              "| sectors a nonzero | PCG us/it as numbered | PCG us/it reordered | cuSPARSE SpMV us "
              "| cupyx cg us/it | ours / SpMV (numbered / reordered) | cupyx / ours (numbered / reordered) "
              "| iterations to pay for RCM | auto's decision | auto's reorder ms |")
    rows, notes = [header, "|" + "---|" * (header.count("|") - 1)], []
    print(header, flush=True)
    for name, make in matrices():
        if args.only and not any(o in name for o in args.only):
            continue
        t0 = time.perf_counter()
        A = make()
        print(f"# {name}: generated in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        row, layouts = probe(name, A)
        rows.append(row)
        notes.append(layouts)
        print(row, flush=True)
        cupy.get_default_memory_pool().free_all_blocks()
    return save(args.out, "probe_reorder", "Reverse Cuthill-McKee on the GPU",
                f"PCG: while mode, Jacobi, float64, {ITERATIONS} iterations that do not stop, the faster variant, "
                f"automatic format; the GPU ordering and the permutation of A the best of {REPEATS} after a "
                f"warm-up; 'iterations to pay' = (ordering + permutation) / (us saved an iteration); auto's "
                f"decision and reorder time from a solver's set-up (PCG(A, device='gpu')).\n\n"
                + "\n".join(rows) + "\n\nFormats: " + "; ".join(notes))


def save(out, prefix, title, body):
    """Print ``body`` under a heading (``title``, time, GPU, commit); save it as
    ``<prefix>_<stamp>_<gpu>_<commit>.md`` under ``out``."""
    commit, gpu = provenance.commit(), kernels.device_name()
    stamp = provenance.stamp()
    text = f"# {title}, {stamp} UTC, {gpu}, commit {commit}\n\n{body}\n"
    path = provenance.save(out, f"{prefix}_{stamp}_{gpu.replace(' ', '_')}_{commit}.md", text)
    print("\n" + text)
    print(f"saved {path}", file=sys.stderr)
    return 0


def save_deferred(out):
    """Run :func:`deferred` on the 500k- and 2M-row geometric graphs; print and save their lines."""
    lines = []
    for n in (500_000, 2_000_000):
        lines += [f"## geometric {n // 1000}k", ""] + deferred(random_geometric_laplacian(n)) + [""]
    return save(out, "probe_reorder_deferred", "Deferred reverse Cuthill-McKee, random geometric graphs",
                "While mode, Jacobi, float64, rtol 1e-8, automatic format and variant.\n\n" + "\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
