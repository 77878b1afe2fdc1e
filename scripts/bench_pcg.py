"""Side-by-side PCG benchmark: this project's drivers against CuPy, JAX, SciPy and one cuSPARSE SpMV.

Run on a GPU machine: ``python scripts/bench_pcg.py [--quick] [--only NAME ...] [--skip NAME ...]
[--modes while ...] [--peers cupyx spmv ...]`` (a column not timed shows "-").
Prints a markdown table (time per iteration, iterations, time to solution, set-up
costs, ratios) and saves it under ``scripts/results/`` with the run's start (date and
time, UTC), the GPU name and the commit.

Problems: Poisson stencils, the SuiteSparse matrices in ``tests/data``, and unstructured
classes from :mod:`solvers.gallery` (random geometric and power-law graph
Laplacians with random numbering, a 27-point stencil and a 7-point stencil on a torus (whose
wrapping couplings DIA keeps apart), each also in ELL with its columns stored where ``auto``
takes DIA), once more with reverse
Cuthill-McKee reordering (``reorder="rcm"``) and with the neighbours' renumbering
(``reorder="neighbours"``) where they apply; the large random geometric graph also as
numbered (``reorder="none"``: SELL lays its rows out by neighbours but keeps the given
numbering), and a second table shows what each ``reorder`` choice costs over one and
several solves, set-up included. Peers run plain CG
for a fixed number of iterations to measure time per iteration (on the Poisson
matrices Jacobi is a scaled identity, so the iteration counts agree); their time
to solution is that times the iterations this project needed. JAX runs in a process of its own for each
problem: with JAX in the benchmark's process, the peers timed after it ran slower.
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import scipy.sparse.linalg as spla  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import provenance  # noqa: E402
import solvers  # noqa: E402
from solvers import kernels  # noqa: E402
from solvers.gallery import (periodic_poisson, poisson, power_law_laplacian, random_geometric_laplacian,  # noqa: E402
                             stencil27)
from solvers.mmio import read_matrix  # noqa: E402

RTOL = 1e-8
MODES = ("while", "graph", "eager")
PEERS = ("cupyx", "spmv", "jax", "scipy", "policies")  # policies: this project's reorder choices compared


def with_random_solution(A):
    """``(A, A x)`` for a fixed random x: where the vector of ones, the other problems' solution, is an
    eigenvector (a torus's Laplacian, whose rows sum to its shift), CG would end in one iteration."""
    return A, A @ np.random.default_rng(0).standard_normal(A.shape[0])


def matrix_and_rhs(make):
    """A problem's matrix and right-hand side (see :func:`problems`)."""
    made = make()
    return made if isinstance(made, tuple) else (made, made @ np.ones(made.shape[0]))


def problems(quick, data_dir):
    """``(name, make, options)``: ``make()`` gives the matrix, whose right-hand side is ``A @ ones``, or the
    matrix and its right-hand side; ``options`` go to this project's solver only."""
    for shape in [(64, 64), (256, 256), (64, 64, 64), (1024, 1024), (160, 160, 160)]:
        yield ("Poisson " + "x".join(map(str, shape)), lambda s=shape: poisson(s), {})
    if data_dir and data_dir.is_dir():
        for name in ("1138_bus.mtx", "gr_900_900_crg.mtx", "lap2D_5pt_n100.mtx"):
            yield (name, lambda p=data_dir / name: read_matrix(str(p)), {})
    big = 200_000 if quick else 2_000_000
    yield ("geometric 50k", lambda: random_geometric_laplacian(50_000), {})
    yield ("power-law 100k", lambda: power_law_laplacian(100_000), {})
    yield (f"geometric {big // 1000}k", lambda: random_geometric_laplacian(big), {})
    yield (f"geometric {big // 1000}k, as numbered", lambda: random_geometric_laplacian(big), {"reorder": "none"})
    yield (f"geometric {big // 1000}k, rcm", lambda: random_geometric_laplacian(big), {"reorder": "rcm"})
    yield (f"geometric {big // 1000}k, neighbours", lambda: random_geometric_laplacian(big),
           {"reorder": "neighbours"})
    yield (f"power-law {big // 2000}k" if not quick else "power-law 100k, second",
           lambda: power_law_laplacian(big // 2), {})
    side = 48 if quick else 128
    yield (f"27-point {side}^3", lambda: stencil27((side, side, side)), {})
    yield (f"27-point {side}^3, as ELL", lambda: stencil27((side, side, side)), {"matrix_format": "ell"})
    torus = lambda: with_random_solution(periodic_poisson((side, side, side)))  # noqa: E731
    yield (f"torus {side}^3", torus, {})
    yield (f"torus {side}^3, as ELL", torus, {"matrix_format": "ell"})
    if not quick:
        yield ("Poisson 256x256x256", lambda: poisson((256, 256, 256)), {})


def reorder_policies(A, b, solves=20):
    """Set-up plus solves, ms, after the first and after ``solves`` solves, for each ``reorder`` choice.

    A fresh solver each (the kernels are compiled by then); returns ``{choice: (first, all, note)}``,
    the note being the solver's ``reordering`` at the end.
    """
    out = {}
    for choice in ("none", "rcm", "neighbours", "auto"):
        solver = solvers.PCG(A, preconditioner="jacobi", rtol=RTOL, device="gpu", mode="while", reorder=choice)
        spent = [solver.setup_time + solver.solve(b).solve_time]
        spent += [solver.solve(b).solve_time for _ in range(solves - 1)]
        out[choice] = (spent[0] * 1e3, sum(spent) * 1e3, solver.reordering)
    return out


def median_time(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bench_ours(A, b, mode, reps, variant="classic", **options):
    solver = solvers.PCG(A, preconditioner="jacobi", rtol=RTOL, device="gpu", mode=mode, maxiter=100000,
                         variant=variant, **options)
    res = solver.solve(b)  # warm-up: compile and capture
    results = [solver.solve(b) for _ in range(reps)]
    loop = float(np.median([r.loop_time for r in results]))
    total = float(np.median([r.solve_time for r in results]))
    return loop / max(res.iterations, 1), res.iterations, total, res.relative_residual, solver


def bench_cupyx(Ad, bd, iters, cupy):
    import cupyx.scipy.sparse.linalg as cla

    def run():
        cla.cg(Ad, bd, rtol=1e-300, atol=0.0, maxiter=iters)
        cupy.cuda.Device().synchronize()
    run()
    return median_time(run, 3) / iters


def bench_spmv(Ad, xd, cupy):
    for _ in range(3):
        Ad @ xd
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    reps = 50
    start.record()
    for _ in range(reps):
        Ad @ xd
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) * 1e-3 / reps


def jax_cg_time(A, b, iters):
    """Seconds an iteration of JAX's ``cg`` on ``A`` (SciPy sparse, as a BCOO matrix) for ``iters``
    iterations, in this process; nan where JAX or its GPU backend is missing."""
    try:
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        from jax.experimental import sparse as jsparse
    except Exception as exc:  # JAX missing or without a GPU backend
        print(f"  jax unavailable: {exc}", file=sys.stderr)
        return float("nan")
    Aj = jsparse.BCOO.from_scipy_sparse(A)
    bj = jnp.asarray(b)

    @jax.jit
    def solve(rhs):
        return jax.scipy.sparse.linalg.cg(lambda v: Aj @ v, rhs, tol=0.0, atol=0.0, maxiter=iters)[0]

    solve(bj).block_until_ready()
    return median_time(lambda: solve(bj).block_until_ready(), 3) / iters


def bench_jax(A, b, iters):
    """:func:`jax_cg_time` in a process of its own: with JAX in the benchmark's process, the peers timed after
    it ran slower (the power-law 1M graph's cuSPARSE SpMV 93.0 us against 70.8 without, MEASUREMENTS.md)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "problem.npz")
        A = sp.csr_matrix(A)
        np.savez(path, data=A.data, indices=A.indices, indptr=A.indptr, shape=A.shape, b=b)
        done = subprocess.run([sys.executable, __file__, "--jax-peer", path, str(iters)], capture_output=True,
                              text=True)
    sys.stderr.write(done.stderr)
    try:
        return float(done.stdout.split()[-1])
    except (IndexError, ValueError):
        print(f"  jax peer failed (exit {done.returncode})", file=sys.stderr)
        return float("nan")


def jax_peer(path, iters):
    """The ``--jax-peer`` process: time JAX's ``cg`` on the problem saved at ``path`` and print the seconds."""
    saved = np.load(path)
    A = sp.csr_matrix((saved["data"], saved["indices"], saved["indptr"]), shape=tuple(saved["shape"]))
    print(jax_cg_time(A, saved["b"], iters))
    return 0


def bench_scipy(A, b, iters):
    return median_time(lambda: spla.cg(A, b, rtol=1e-300, atol=0.0, maxiter=iters), 1) / iters


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the largest problem")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", nargs="*", help="problem names to run (substring match)")
    ap.add_argument("--skip", nargs="*", default=(), help="problem names to leave out (substring match)")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=MODES,
                    help="this project's drivers to time (while is always timed: the ratios use it)")
    ap.add_argument("--peers", nargs="+", choices=PEERS, default=PEERS, help="peers to time")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    ap.add_argument("--jax-peer", nargs=2, metavar=("NPZ", "ITERS"), help=argparse.SUPPRESS)  # bench_jax's process
    args = ap.parse_args(argv)
    if args.jax_peer:
        return jax_peer(args.jax_peer[0], int(args.jax_peer[1]))
    import cupy
    import cupyx.scipy.sparse as csp

    repo = pathlib.Path(__file__).resolve().parent.parent
    data = repo / "tests" / "data" / "matrices"
    header = ("| problem | n | nnz | storage | iters | while us/it | graph us/it | eager us/it | 1-red. iters "
              "| 1-red. while us/it | cupyx cg us/it | JAX cg us/it | SciPy us/it | cuSPARSE SpMV us "
              "| best while time to sol. ms | format ms | reorder ms | cupyx/best | JAX/best | best/SpMV "
              "| rel. residual |")
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    policies = []
    for name, make, options in problems(args.quick, data):
        if args.only and not any(o in name for o in args.only) or any(s in name for s in args.skip):
            continue
        A, b = matrix_and_rhs(make)
        n = A.shape[0]
        print(f"{name}: n={n:,} nnz={A.nnz:,}", file=sys.stderr, flush=True)
        per_it = {mode: float("nan") for mode in MODES}
        format_times = []  # the fastest of the set-ups counts: the first also compiles CuPy's own kernels
        for mode in [m for m in MODES if m == "while" or m in args.modes]:
            reps = args.reps if mode == "while" else max(1, args.reps // 2)
            t_it, its, t_s, res, solver = bench_ours(A, b, mode, reps, **options)
            format_times.append(solver._impl.format_time)
            if mode == "while":
                iters, t_sol, rel = its, t_s, res
                storage = solver.format
                reorder_ms = solver.reorder_time * 1e3 if solver.reorder_time else None
            per_it[mode] = t_it
        t1, iters1, t_sol1, rel1, solver = bench_ours(A, b, "while", args.reps, "single-reduction", **options)
        format_ms = min(format_times + [solver._impl.format_time]) * 1e3
        best = min(per_it["while"], t1)
        if t_sol1 < t_sol:
            t_sol, rel = t_sol1, rel1
        Ad, bd = csp.csr_matrix(A), cupy.asarray(b)
        peer_iters = int(min(max(iters, 20), 200))
        nan = float("nan")
        cu = bench_cupyx(Ad, bd, peer_iters, cupy) if "cupyx" in args.peers else nan
        spmv = bench_spmv(Ad, bd, cupy) if "spmv" in args.peers else nan
        jx = bench_jax(A, b, peer_iters) if "jax" in args.peers else nan
        sc = bench_scipy(A, b, min(peer_iters, 20 if n > 500_000 else 200)) if "scipy" in args.peers else nan
        us = lambda t: "-" if np.isnan(t) else f"{t * 1e6:.1f}"  # noqa: E731
        ratio = lambda t, fmt: "-" if np.isnan(t) else fmt.format(t)  # noqa: E731
        reorder_text = f"{reorder_ms:.1f}" if reorder_ms is not None else "-"
        rows.append(f"| {name} | {n:,} | {A.nnz:,} | {storage} | {iters} | {us(per_it['while'])} "
                    f"| {us(per_it['graph'])} | {us(per_it['eager'])} | {iters1} | {us(t1)} | {us(cu)} | {us(jx)} "
                    f"| {us(sc)} | {us(spmv)} | {t_sol * 1e3:.2f} | {format_ms:.1f} | {reorder_text} "
                    f"| {ratio(cu / best, '{:.1f}x')} | {ratio(jx / best, '{:.1f}x')} "
                    f"| {ratio(best / spmv, '{:.2f}')} | {rel:.1e} |")
        print(rows[-1], flush=True)
        if name.startswith("geometric") and name.endswith(", as numbered") and "policies" in args.peers:
            policies.append((name, reorder_policies(A, b)))
        del Ad, bd
        cupy.get_default_memory_pool().free_all_blocks()
        path = save(rows, policies, args.out, kernels.device_name())  # after every problem: a cut run keeps its rows
    print(pathlib.Path(path).read_text())
    print(f"saved {path}", file=sys.stderr)
    return 0


def save(rows, policies, folder, gpu):
    """Write the tables so far under ``folder``; return the file's path."""
    commit = provenance.commit()
    stamp = provenance.stamp()
    text = (f"# PCG benchmark, {stamp} UTC, {gpu}, commit {commit}\n\n"
            f"float64, Jacobi PCG to rtol {RTOL:g} for this project (classic in three modes, single-reduction "
            f"(1-red.) in while mode; 'best' is the faster while variant; 'storage' is the automatic "
            f"choice of matrix format; 'format ms' its conversion, 'reorder ms' the reordering where asked "
            f"for); peers plain CG, fixed iteration count.\n\n"
            + "\n".join(rows) + "\n")
    if policies:
        text += ("\nReordering choices, set-up plus solves (ms), a fresh solver each, while mode, float64, Jacobi, "
                 f"rtol {RTOL:g}: 'as numbered' is reorder='none', 'rcm' and 'neighbours' reorder at set-up, "
                 "'auto' is the default (SELL's own numbering where it lays the rows out by neighbours, else the "
                 "neighbours' renumbering deferred until it pays).\n\n"
                 "| problem | solves | as numbered | rcm at set-up | neighbours at set-up | auto "
                 "| auto's reordering at the end |\n|---|---|---|---|---|---|---|\n")
        for name, out in policies:
            for k, solves in ((0, 1), (1, 20)):
                text += (f"| {name} | {solves} | {out['none'][k]:.1f} | {out['rcm'][k]:.1f} "
                         f"| {out['neighbours'][k]:.1f} | {out['auto'][k]:.1f} "
                         f"| {out['auto'][2] if solves > 1 else ''} |\n")
    return provenance.save(folder, f"pcg_{stamp}_{gpu.replace(' ', '_')}_{commit}.md", text)


if __name__ == "__main__":
    sys.exit(main())
