"""Batched solves side by side: this project's BatchedPCG against jax.vmap over JAX's cg and a loop over cupyx cg.

Run on a GPU machine: ``python scripts/bench_small.py [--systems 10000] [--side 32]``.
Every method solves the same variable-coefficient 2-D diffusion systems (one
sparsity pattern, lognormal coefficients), Jacobi-preconditioned, to rtol 1e-8,
and is timed to completion; the cupyx loop is timed on a sample of systems and
its rate extrapolated. Prints a markdown table of systems per second and saves it
under ``scripts/results/``.
"""
import argparse
import datetime
import os
import pathlib
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import provenance  # noqa: E402
import solvers  # noqa: E402
from solvers.gallery import variable_diffusion  # noqa: E402

RTOL = 1e-8


def problem(systems, side, seed=0):
    rng = np.random.default_rng(seed)
    pattern = variable_diffusion(np.ones((side, side)))
    values = np.array([variable_diffusion(np.exp(rng.normal(size=(side, side)))).data for _ in range(systems)])
    b = rng.standard_normal((systems, side * side))
    return pattern, values, b


def best_of(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def bench_ours(pattern, values, b, reps):
    batch = solvers.BatchedPCG.from_pattern(pattern, values, rtol=RTOL, device="gpu", maxiter=10000)
    batch.solve(b)  # warm-up: compile
    t, res = best_of(lambda: batch.solve(b), reps)
    assert res.converged.all(), "a system did not converge"
    return t, int(res.iterations.max()), float(res.relative_residuals.max())


def bench_jax(pattern, values, b, reps):
    try:
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        from jax.experimental import sparse as jsparse
    except Exception as exc:  # JAX missing or without a GPU backend
        print(f"jax unavailable: {exc}", file=sys.stderr)
        return float("nan"), None
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
    t, x = best_of(lambda: run(data_j, b_j).block_until_ready(), reps)
    return t, np.asarray(x)


def bench_cupyx_loop(pattern, values, b, sample):
    import cupy
    import cupyx.scipy.sparse as csp
    import cupyx.scipy.sparse.linalg as cla

    def one(s):
        A = csp.csr_matrix((cupy.asarray(values[s]), cupy.asarray(pattern.indices), cupy.asarray(pattern.indptr)),
                           shape=pattern.shape)
        d = A.diagonal()
        M = cla.LinearOperator(A.shape, matvec=lambda v: v / d)
        cla.cg(A, cupy.asarray(b[s]), rtol=RTOL, atol=0.0, maxiter=10000, M=M)
    one(0)
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for s in range(sample):
        one(s)
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - t0) / sample


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", type=int, default=10_000)
    ap.add_argument("--side", type=int, default=32, help="grid side: side^2 unknowns a system")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sample", type=int, default=20, help="systems the cupyx loop is timed on")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    import cupy
    pattern, values, b = problem(args.systems, args.side)
    t_ours, its, worst = bench_ours(pattern, values, b, args.reps)
    t_jax, _ = bench_jax(pattern, values, b, args.reps)
    t_loop = bench_cupyx_loop(pattern, values, b, args.sample)
    rate = args.systems / t_ours
    rows = ["| method | systems | seconds | systems/s | this project's rate / method's |", "|---|---|---|---|---|",
            f"| BatchedPCG (one launch; max {its} iterations, worst rel. residual {worst:.1e}) | {args.systems:,} "
            f"| {t_ours:.4f} | {rate:,.0f} | 1.0x |",
            f"| jax.vmap over jax.scipy.sparse.linalg.cg (BCOO, jit, x64) | {args.systems:,} | {t_jax:.4f} "
            f"| {args.systems / t_jax:,.0f} | {t_jax / t_ours:.1f}x |",
            f"| Python loop over cupyx cg ({args.sample} systems timed) | {args.systems:,} "
            f"| {t_loop * args.systems:.2f} (extrapolated) | {1 / t_loop:,.0f} | {rate * t_loop:.0f}x |"]
    gpu = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    text = (f"# Batched solves, {stamp}, {gpu}, commit {provenance.commit()}\n\n"
            f"{args.systems:,} variable-coefficient 2-D diffusion systems of {args.side}x{args.side} unknowns "
            f"(lognormal coefficients, one pattern), Jacobi PCG to rtol {RTOL:g}, float64.\n\n"
            + "\n".join(rows) + "\n")
    print(text)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"small_{stamp}_{gpu.replace(' ', '_')}_{provenance.commit()}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
