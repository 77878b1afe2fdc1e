"""Small systems side by side: PCG's on-chip and grid paths per iteration, batched solves against JAX and cupyx.

Run on a GPU machine: ``python scripts/bench_small.py [--systems 10000] [--side 32]``.

* Per iteration (float64, Jacobi, while mode): each small matrix solved by the
  on-chip path (one block or cluster) and by the grid path (the whole GPU), a
  fixed number of iterations (rtol 0), loop time over iterations, best of a few.
* Captured time step: ``examples/heat_implicit.py``'s backward Euler step, PCG.solve
  per step (while mode) against the whole step captured into one graph and replayed.
* Right-hand sides of one matrix: 2-D Poisson (1024^2 by default), Jacobi to rtol 1e-8,
  ``PCG.solve`` with ``b`` of shape ``(n, k)`` (while mode) against one right-hand
  side (k = 1) and a Python loop over cupyx ``cg``, per iteration, with the memory
  traffic floor of an iteration at k columns.
* Batched: variable-coefficient 2-D diffusion systems (one sparsity pattern,
  lognormal coefficients), Jacobi to rtol 1e-8, ``b`` already on the device for
  every method: BatchedPCG, ``jax.vmap`` over ``jax.scipy.sparse.linalg.cg``
  (jit, x64, BCOO), and a Python loop over cupyx ``cg`` timed on a sample.

Prints markdown tables and saves them (with the commit) under ``scripts/results/``.
"""
import argparse
import os
import pathlib
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import provenance  # noqa: E402
import solvers  # noqa: E402
from solvers.gallery import poisson, power_law_laplacian, random_geometric_laplacian, variable_diffusion  # noqa: E402
from solvers.mmio import read_matrix  # noqa: E402
from solvers import kernels  # noqa: E402

RTOL = 1e-8
DATA = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "matrices"


def best_of(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


# -- per iteration --------------------------------------------------------------------------------
def small_matrices():
    """``(name, matrix, reorder)``: the small systems, as numbered (and the geometric graph also reordered)."""
    out = [("2D Poisson 64^2", poisson((64, 64)), "none")]
    for name in ("1138_bus", "gr_900_900_crg", "lap2D_5pt_n100"):
        out.append((name, read_matrix(str(DATA / f"{name}.mtx")), "none"))
    out += [("2D Poisson 128^2", poisson((128, 128)), "none"), ("2D Poisson 256^2", poisson((256, 256)), "none")]
    # graph Laplacians with a hub row (scripts/bench_pcg.py's class, small): one on chip, one too large for it
    out += [(f"power-law graph {n}", power_law_laplacian(n), "none") for n in (500, 2000)]
    geometric = random_geometric_laplacian(50_000)  # scripts/bench_pcg.py's "geometric 50k"
    out += [("3D geometric graph 50k", geometric, "none"), ("3D geometric graph 50k, rcm", geometric, "rcm")]
    return out


def per_iteration(A, path, unroll, iterations, reps, reorder="none"):
    """Best us per iteration over ``reps`` solves of exactly ``iterations`` iterations, and the solver."""
    solver = solvers.PCG(A, device="gpu", mode="while", path=path, unroll=unroll, rtol=0.0, maxiter=iterations,
                         reorder=reorder)
    b = np.random.default_rng(0).standard_normal(A.shape[0])
    solver.solve(b)  # warm-up: capture
    best = np.inf
    for _ in range(reps):
        res = solver.solve(b)
        best = min(best, res.loop_time / max(res.iterations, 1))
    return best * 1e6, solver, res


def iteration_table(iterations, reps, names=()):
    rows = ["| matrix | n | nnz | on-chip variant and layout | on-chip us/it (32 it. a launch) "
            "| on-chip us/it (whole solve a launch) | grid us/it | auto takes |", "|---|---|---|---|---|---|---|---|"]
    for name, A, reorder in small_matrices():
        if names and name not in names:
            continue
        n, nnz = A.shape[0], A.nnz
        try:
            t32, solver, _ = per_iteration(A, "on-chip", 32, iterations, reps, reorder)
            tall, _, _ = per_iteration(A, "on-chip", iterations + 1, iterations, reps, reorder)
            layout = f"{solver.variant}, {solver.format}"
        except solvers.InputError as exc:
            t32 = tall = float("nan")
            layout = f"refused: {exc}"
        tgrid, _, _ = per_iteration(A, "grid", 32, iterations, reps, reorder)
        auto = solvers.PCG(A, device="gpu", reorder=reorder).path
        rows.append(f"| {name} | {n:,} | {nnz:,} | {layout} | {t32:.2f} | {tall:.2f} | {tgrid:.2f} | {auto} |")
        print(rows[-1], flush=True)
    return rows


# -- captured time step ------------------------------------------------------------------------
def heat_table(sizes, steps):
    import importlib.util
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "heat_implicit.py"
    spec = importlib.util.spec_from_file_location("heat_implicit", path)
    heat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(heat)
    rows = ["| grid | path | solve per step (while mode) ms | captured step ms | speed-up | PCG it./step "
            "| max difference |", "|---|---|---|---|---|---|---|"]
    for m in sizes:
        A, u0 = heat.step_matrix(m, 0.05 / steps), heat.initial_field(m)
        heat.run_project(A, u0, 3, "gpu", "while", 1e-10)  # warm-up: compile and capture
        u_plain, t_plain, its, solver = heat.run_project(A, u0, steps, "gpu", "while", 1e-10)
        u_step, t_step, _, _ = heat.run_captured(A, u0, steps, 1e-10)
        diff = np.abs(u_step - u_plain).max() / np.abs(u_plain).max()
        rows.append(f"| {m}^2 | {solver.path} | {t_plain * 1e3:.3f} | {t_step * 1e3:.3f} | {t_plain / t_step:.1f}x "
                    f"| {its:.1f} | {diff:.1e} |")
        print(rows[-1], flush=True)
    return rows


# -- right-hand sides of one matrix ------------------------------------------------------------------
BANDWIDTH = 4.28e12  # bytes/s an H200 streams (the floor's unit)


def floor_us(n, columns):
    """The least memory traffic of an iteration at ``columns`` columns, in us at BANDWIDTH: x, r and p
    of every column read and written once (48 bytes a row and column)."""
    return 48 * n * columns / BANDWIDTH * 1e6


def bench_columns(A, B, reps):
    """Best us per iteration of PCG.solve on ``B``'s columns at once (one column: the single-RHS path)."""
    import cupy
    solver = solvers.PCG(A, device="gpu", mode="while", rtol=RTOL, reorder="none", maxiter=20000)
    b = cupy.asarray(B[:, 0] if B.shape[1] == 1 else B)
    solver.solve(b)  # warm-up: compile and capture
    best, res = np.inf, None
    for _ in range(reps):
        res = solver.solve(b)
        its = int(np.max(res.iterations))
        best = min(best, res.loop_time / its)
    converged = bool(np.all(res.converged))
    return best * 1e6, its, converged, solver


def bench_cupyx_columns(A, B):
    """Seconds and iterations of a Python loop over cupyx cg (Jacobi) on ``B``'s columns."""
    import cupy
    import cupyx.scipy.sparse as csp
    import cupyx.scipy.sparse.linalg as cla

    Ad = csp.csr_matrix(A)
    d = Ad.diagonal()
    M = cla.LinearOperator(A.shape, matvec=lambda v: v / d)
    iterations = []
    cols = [cupy.asarray(B[:, j]) for j in range(B.shape[1])]
    cla.cg(Ad, cols[0], rtol=RTOL, atol=0.0, maxiter=20000, M=M)  # warm-up
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for b in cols:
        count = [0]
        cla.cg(Ad, b, rtol=RTOL, atol=0.0, maxiter=20000, M=M, callback=lambda xk: count.__setitem__(0, count[0] + 1))
        iterations.append(count[0])
    cupy.cuda.Device().synchronize()
    return time.perf_counter() - t0, iterations


def columns_table(side, counts, reps):
    A = poisson((side, side))
    n = A.shape[0]
    rng = np.random.default_rng(0)
    widest = rng.standard_normal((n, max(counts)))
    rows = [f"2-D Poisson {side}^2 ({n:,} rows), Jacobi PCG to rtol {RTOL:g}, float64, while mode, b on the device; "
            f"the floor is x, r and p of every column read and written once an iteration (48 bytes a row and "
            f"column) at {BANDWIDTH / 1e12:.2f} TB/s.", "",
            "| right-hand sides | method | us/iteration | x one right-hand side | floor us/it. | floor / measured "
            "| iterations (max) | all converged |", "|---|---|---|---|---|---|---|---|"]
    single = None
    for k in counts:
        t, its, ok, solver = bench_columns(A, widest[:, :k], reps)
        single = t if k == 1 else single
        what = f"PCG.solve, b ({n:,}, {k})" if k > 1 else f"PCG.solve, one vector ({solver.variant}, {solver.format})"
        rows.append(f"| {k} | {what} | {t:.1f} | {t / single:.2f}x | {floor_us(n, k):.1f} | "
                    f"{floor_us(n, k) / t:.0%} | {its} | {ok} |")
        print(rows[-1], flush=True)
    k = max(counts)
    seconds, iterations = bench_cupyx_columns(A, widest[:, :k])
    per_it = seconds / sum(iterations) * 1e6
    rows.append(f"| {k} | Python loop over cupyx cg (Jacobi), column by column | {per_it * k:.1f} (all {k} columns "
                f"an iteration) | {per_it * k / single:.2f}x | {floor_us(n, k):.1f} | {floor_us(n, k) / (per_it * k):.0%} "
                f"| {max(iterations)} | - |")
    print(rows[-1], flush=True)
    return rows


# -- batched --------------------------------------------------------------------------------------
def problem(systems, side, seed=0):
    rng = np.random.default_rng(seed)
    pattern = variable_diffusion(np.ones((side, side)))
    values = np.array([variable_diffusion(np.exp(rng.normal(size=(side, side)))).data for _ in range(systems)])
    b = rng.standard_normal((systems, side * side))
    return pattern, values, b


def bench_ours(pattern, values, b, reps):
    import cupy
    batch = solvers.BatchedPCG.from_pattern(pattern, values, rtol=RTOL, device="gpu", maxiter=10000)
    b_dev = cupy.asarray(b)
    batch.solve(b_dev)  # warm-up: compile
    t, res = best_of(lambda: batch.solve(b_dev), reps)
    assert res.converged.all(), "a system did not converge"
    t_host, _ = best_of(lambda: batch.solve(b), reps)
    return t, t_host, int(res.iterations.max()), float(res.relative_residuals.max()), batch.path


def bench_jax(pattern, values, b, reps):
    try:
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        from jax.experimental import sparse as jsparse
    except Exception as exc:  # JAX missing or without a GPU backend
        print(f"jax unavailable: {exc}", file=sys.stderr)
        return float("nan")
    coo = pattern.tocoo()  # CSR order: the values' order
    indices = jnp.asarray(np.stack([coo.row, coo.col], axis=1))
    diagonal = np.nonzero(coo.row == coo.col)[0]  # where each system's diagonal sits in its values
    n = pattern.shape[0]

    def solve(data, rhs):
        A = jsparse.BCOO((data, indices), shape=(n, n))
        d = data[diagonal]
        x, _ = jax.scipy.sparse.linalg.cg(lambda v: A @ v, rhs, tol=RTOL, atol=0.0, maxiter=10000,
                                          M=lambda v: v / d)
        return x

    run = jax.jit(jax.vmap(solve))
    data_j, b_j = jnp.asarray(values), jnp.asarray(b)
    run(data_j, b_j).block_until_ready()
    t, _ = best_of(lambda: run(data_j, b_j).block_until_ready(), reps)
    return t


def bench_cupyx_loop(pattern, values, b, sample):
    import cupy
    import cupyx.scipy.sparse as csp
    import cupyx.scipy.sparse.linalg as cla

    mats = [csp.csr_matrix((cupy.asarray(values[s]), cupy.asarray(pattern.indices), cupy.asarray(pattern.indptr)),
                           shape=pattern.shape) for s in range(sample)]
    rhs = [cupy.asarray(b[s]) for s in range(sample)]

    def one(s):
        A = mats[s]
        d = A.diagonal()
        M = cla.LinearOperator(A.shape, matvec=lambda v: v / d)
        cla.cg(A, rhs[s], rtol=RTOL, atol=0.0, maxiter=10000, M=M)
    one(0)
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for s in range(sample):
        one(s)
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - t0) / sample


def batch_table(systems, side, reps, sample):
    pattern, values, b = problem(systems, side)
    t_ours, t_host, its, worst, layout = bench_ours(pattern, values, b, reps)
    t_jax = bench_jax(pattern, values, b, reps)
    t_loop = bench_cupyx_loop(pattern, values, b, sample)
    rate = systems / t_ours
    return [f"{systems:,} variable-coefficient 2-D diffusion systems of {side}x{side} unknowns (lognormal "
            f"coefficients, one pattern), Jacobi PCG to rtol {RTOL:g}, float64, b on the device.", "",
            "| method | seconds | systems/s | BatchedPCG's rate / method's |", "|---|---|---|---|",
            f"| BatchedPCG ({layout}; one launch; max {its} iterations, worst rel. residual {worst:.1e}) "
            f"| {t_ours:.4f} | {rate:,.0f} | 1.0x |",
            f"| BatchedPCG, b on the host (copied in) | {t_host:.4f} | {systems / t_host:,.0f} | {t_host / t_ours:.2f}x |",
            f"| jax.vmap over jax.scipy.sparse.linalg.cg (BCOO, jit, x64) | {t_jax:.4f} | {systems / t_jax:,.0f} "
            f"| {t_jax / t_ours:.1f}x |",
            f"| Python loop over cupyx cg ({sample} systems timed) | {t_loop * systems:.2f} (extrapolated) "
            f"| {1 / t_loop:,.0f} | {rate * t_loop:.0f}x |"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", type=int, default=10_000)
    ap.add_argument("--side", type=int, default=32, help="grid side: side^2 unknowns a system")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=2000, help="iterations a per-iteration timing runs")
    ap.add_argument("--sample", type=int, default=20, help="systems the cupyx loop is timed on")
    ap.add_argument("--only", choices=("iterations", "heat", "columns", "batch"), help="run one part only")
    ap.add_argument("--matrices", default="",
                    help="comma-separated names of the per-iteration table's matrices (default: all)")
    ap.add_argument("--columns-side", type=int, default=1024, help="grid side of the right-hand sides' Poisson matrix")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    gpu = kernels.device_name()
    now = provenance.stamp()
    sections = [f"# Small systems, {now} UTC, {gpu}, commit {provenance.commit()}", ""]
    if args.only in (None, "iterations"):
        sections += ["## PCG per iteration, float64, Jacobi, while mode", "",
                     *iteration_table(args.iterations, args.reps, [n for n in args.matrices.split(",") if n]), ""]
    if args.only in (None, "heat"):
        sections += ["## Heat equation time step (examples/heat_implicit.py), 100 steps, rtol 1e-10", "",
                     *heat_table((64, 256), 100), ""]
    if args.only in (None, "columns"):
        sections += ["## Right-hand sides of one matrix", "", *columns_table(args.columns_side, (1, 4, 16), args.reps), ""]
    if args.only in (None, "batch"):
        sections += ["## Batched solves", "", *batch_table(args.systems, args.side, args.reps, args.sample), ""]
    text = "\n".join(sections)
    print(text)
    provenance.save(args.out, f"small_{now}_{gpu.replace(' ', '_')}_{provenance.commit()}.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
