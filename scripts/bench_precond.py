"""Time to solution with each preconditioner: Jacobi, Chebyshev and AMG on the GPU, PyAMG on the CPU, cupyx cg.

Run on a GPU machine: ``python scripts/bench_precond.py [--diffusion N] [--elasticity N]``.
Problems (``solvers.gallery``): rotated anisotropic diffusion (PyAMG's
``diffusion_stencil_2d(epsilon=1e-3, theta=pi/6)``) on an N x N grid (2048) and 2-D
linear elasticity on N x N (1024) with its rigid body modes as AMG's near-nullspace.
float64, rtol 1e-8, a random right-hand side. Prints a markdown table, one row a
method, and saves it under ``scripts/results/`` with the run's start (date and time, UTC), the GPU and
the commit.

Rows: ``--methods`` (Jacobi, AMG with its defaults, AMG variants, Chebyshev, PyAMG, cupyx).
Columns: ``setup s`` is the solver's whole set-up (upload, matrix format, the
preconditioner's set-up; each method is first set up and run once on the same problem, so
kernel compilation is not in it: a smaller problem of the same kind can have fewer levels, or
other row lengths on its coarse ones, and leave kernels of the timed hierarchy uncompiled),
``precond setup s`` the
preconditioner's own share of it (for AMG the hierarchy, on the GPU or by PyAMG on the
CPU as ``--setup`` says, plus each level's eigenvalue estimate); ``solve s`` for AMG the median of ``--reps`` solves
after a first one that also captures the graph, for the others (seconds long) the
median of ``--reps // 3`` solves after the first, or the first alone when that is 0;
``us/it`` the device loop's time over the iterations. PyAMG runs its default smoothed
aggregation (symmetric Gauss-Seidel) with ``accel="cg"`` on the CPU (mostly one core). cupyx runs
its ``cg`` with a Jacobi ``M`` for ``--cupyx-iterations`` iterations (its iterates are
Jacobi-PCG's): its time to solution is its time per iteration times the iterations
Jacobi-PCG took here.
"""
import argparse
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import provenance  # noqa: E402
import solvers  # noqa: E402
from solvers.gallery import linear_elasticity_2d, rotated_anisotropic_diffusion  # noqa: E402
from solvers.pcg import AMG, Chebyshev  # noqa: E402
from solvers import kernels  # noqa: E402

RTOL = 1e-8
MAXITER = 200_000


def problems(diffusion, elasticity):
    """``(name, A, near-nullspace or None)``."""
    if diffusion:
        A = rotated_anisotropic_diffusion((diffusion, diffusion))
        yield f"rotated anisotropic diffusion {diffusion}^2", A, None
    if elasticity:
        A, B = linear_elasticity_2d((elasticity, elasticity))
        yield f"linear elasticity {elasticity}^2", A, B


#: name -> (row label, the preconditioner given AMG's near-nullspace B and where its hierarchy is built)
METHODS = {
    "jacobi": ("GPU Jacobi-PCG", lambda B, setup: "jacobi"),
    "amg": ("GPU AMG-PCG", lambda B, setup: AMG(near_nullspace=B, setup=setup)),
    "amg-float64": ("GPU AMG-PCG, float64 hierarchy",
                    lambda B, setup: AMG(near_nullspace=B, setup=setup, hierarchy_dtype="float64")),
    "amg-degree2": ("GPU AMG-PCG, Chebyshev degree 2", lambda B, setup: AMG(near_nullspace=B, setup=setup, degree=2)),
    "amg-theta0": ("GPU AMG-PCG, theta 0 (PyAMG's default)",
                   lambda B, setup: AMG(near_nullspace=B, setup=setup, theta=0.0)),
    "chebyshev": ("GPU Chebyshev(3)-PCG", lambda B, setup: Chebyshev(3)),
}
OTHERS = ("pyamg", "cupyx")  # not our GPU solver: PyAMG on the CPU, cupyx cg
DEFAULT_METHODS = "jacobi,amg,amg-float64,amg-degree2,chebyshev,pyamg,cupyx"


def methods(B, setup, names):
    """``(label, preconditioner)`` of the GPU methods among ``names``, ``B`` AMG's near-nullspace."""
    return [(METHODS[name][0], METHODS[name][1](B, setup)) for name in names if name in METHODS]


def warm_up(cases, setup, names):
    """Set up and run every GPU method once on each of ``cases`` (``problems``' triples), so the timed
    set-ups find CuPy's, the PCG and the preconditioners' kernels compiled (a program's first set-up
    pays for that once; CuPy keeps them on disk for the next); the memory pool is emptied after."""
    import cupy
    for _, A, B in cases:
        for _, preconditioner in methods(B, setup, names):
            solvers.PCG(A, preconditioner=preconditioner, rtol=RTOL, device="gpu").solve(np.ones(A.shape[0]))
    cupy.get_default_memory_pool().free_all_blocks()


class Row(dict):
    """One method's figures (missing ones print as '-')."""

    COLUMNS = ("method", "setup s", "precond setup s", "solve s", "total s", "iterations", "us/it", "rel. residual")

    def line(self, problem, n):
        cells = [problem, f"{n:,}"]
        for key in self.COLUMNS:
            value = self.get(key)
            if value is None:
                cells.append("-")
            elif isinstance(value, float):
                cells.append(f"{value:.3g}" if key != "rel. residual" else f"{value:.1e}")
            else:
                cells.append(str(value))
        return "| " + " | ".join(cells) + " |"


def ours(A, b, preconditioner, reps):
    """Set up and solve on the GPU; the solve column is the median after a first (capturing) solve."""
    t0 = time.perf_counter()
    solver = solvers.PCG(A, preconditioner=preconditioner, rtol=RTOL, device="gpu", maxiter=MAXITER)
    setup = time.perf_counter() - t0
    first = solver.solve(b)
    results = [solver.solve(b) for _ in range(reps)] or [first]
    solve = float(np.median([r.solve_time for r in results]))
    loop = float(np.median([r.loop_time for r in results]))
    res = results[-1]
    if not res.converged:
        print(f"  not converged: {res.reason.label}", file=sys.stderr)
    return solver, Row({"setup s": setup, "precond setup s": solver.preconditioner_setup_time, "solve s": solve,
                        "total s": setup + solve, "iterations": res.iterations,
                        "us/it": loop / max(res.iterations, 1) * 1e6, "rel. residual": res.relative_residual})


def pyamg_cpu(A, B, b):
    import pyamg

    t0 = time.perf_counter()
    ml = pyamg.smoothed_aggregation_solver(A, B=B)
    setup = time.perf_counter() - t0
    print(f"  PyAMG set-up {setup:.2f} s, solving", file=sys.stderr, flush=True)  # a cut run still says this much
    residuals = []
    t0 = time.perf_counter()
    x = ml.solve(b, tol=RTOL, accel="cg", maxiter=2000, residuals=residuals)
    solve = time.perf_counter() - t0
    its = len(residuals) - 1
    return Row({"setup s": setup, "solve s": solve, "total s": setup + solve, "iterations": its,
                "us/it": solve / max(its, 1) * 1e6,
                "rel. residual": float(np.linalg.norm(b - A @ x) / np.linalg.norm(b))})


def cupyx_cg(A, b, iterations, needed):
    import cupy
    import cupyx.scipy.sparse as csp
    import cupyx.scipy.sparse.linalg as cla

    t0 = time.perf_counter()
    Ad, bd = csp.csr_matrix(A), cupy.asarray(b)
    M = csp.diags(1.0 / Ad.diagonal())
    cupy.cuda.Device().synchronize()
    setup = time.perf_counter() - t0
    count = [0]

    def run():
        count[0] = 0
        x, _ = cla.cg(Ad, bd, rtol=RTOL, maxiter=iterations, M=M,
                      callback=lambda _: count.__setitem__(0, count[0] + 1))
        cupy.cuda.Device().synchronize()
        return x

    run()  # compiles CuPy's kernels
    t0 = time.perf_counter()
    run()
    per_iteration = (time.perf_counter() - t0) / max(count[0], 1)
    solve = per_iteration * needed
    return Row({"setup s": setup, "solve s": solve, "total s": setup + solve, "iterations": needed,
                "us/it": per_iteration * 1e6})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--diffusion", type=int, default=2048, metavar="N", help="diffusion grid side (0: skip)")
    ap.add_argument("--elasticity", type=int, default=1024, metavar="N", help="elasticity grid side (0: skip)")
    ap.add_argument("--reps", type=int, default=3, help="solves measured after the first")
    ap.add_argument("--pyamg-max-rows", type=int, default=600_000,
                    help="run PyAMG on the CPU only up to this many rows (it takes minutes above)")
    ap.add_argument("--setup", choices=("gpu", "cpu"), default="gpu",
                    help="where AMG's hierarchy is built: on the GPU, or by PyAMG on the CPU (default gpu)")
    ap.add_argument("--methods", default=DEFAULT_METHODS,
                    help=f"comma-separated rows to run, of {', '.join([*METHODS, *OTHERS])} "
                         f"(default {DEFAULT_METHODS})")
    ap.add_argument("--cupyx-iterations", type=int, default=200, help="iterations cupyx cg is timed over")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    names = args.methods.split(",")
    unknown = [name for name in names if name not in METHODS and name not in OTHERS]
    if unknown:
        ap.error(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join([*METHODS, *OTHERS])}")
    import cupy

    gpu = kernels.device_name()
    header = "| problem | n | " + " | ".join(Row.COLUMNS) + " |"
    rows, notes = [header, "|" + "---|" * (len(Row.COLUMNS) + 2)], []
    cases = list(problems(args.diffusion, args.elasticity))
    if any(name in METHODS for name in names):
        warm_up(cases, args.setup, names)
    for name, A, B in cases:
        n = A.shape[0]
        b = np.random.default_rng(0).random(n)
        print(f"{name}: n={n:,} nnz={A.nnz:,}", file=sys.stderr, flush=True)
        found = {}
        for label, preconditioner in methods(B, args.setup, names):
            reps = args.reps if label.startswith("GPU AMG") else args.reps // 3
            solver, row = ours(A, b, preconditioner, reps)
            row["method"] = f"{label} ({solver.variant}, {solver.mode}" + (
                f", set-up {args.setup})" if label.startswith("GPU AMG") else ")")
            found[label] = row
            rows.append(row.line(name, n))
            print(rows[-1], flush=True)
            if label == "GPU AMG-PCG":
                details = solver.preconditioner_details
                notes.append(f"{name}: AMG {len(details['levels'])} levels, operator complexity "
                             f"{details['operator_complexity']:.3f}, {details['cycle']}, "
                             f"{solver._impl.program.launches} launches a V-cycle")
            del solver
            cupy.get_default_memory_pool().free_all_blocks()
        if "pyamg" in names:
            if n <= args.pyamg_max_rows:
                row = pyamg_cpu(A, B, b)
                row["method"] = f"PyAMG CPU (default SA, accel cg; a host of {os.cpu_count()} cores)"
                found["pyamg"] = row
            else:
                row = Row(method=f"PyAMG CPU: not run (n > --pyamg-max-rows {args.pyamg_max_rows:,})")
            rows.append(row.line(name, n))
            print(rows[-1], flush=True)
        if "cupyx" in names and "GPU Jacobi-PCG" in found:
            row = cupyx_cg(A, b, args.cupyx_iterations, found["GPU Jacobi-PCG"]["iterations"])
            row["method"] = f"cupyx cg, Jacobi M (timed over {args.cupyx_iterations} iterations)"
            rows.append(row.line(name, n))
            print(rows[-1], flush=True)
            cupy.get_default_memory_pool().free_all_blocks()
        jacobi, amg = found.get("GPU Jacobi-PCG"), found.get("GPU AMG-PCG")
        if jacobi and amg:
            line = (f"{name}: AMG-PCG solve {jacobi['solve s'] / amg['solve s']:.1f}x faster than Jacobi-PCG "
                    f"(target >= 20x); one AMG-PCG iteration = {amg['us/it'] / jacobi['us/it']:.1f}x one "
                    f"Jacobi-PCG iteration (target <= 10x); set-up included "
                    f"{jacobi['total s'] / amg['total s']:.1f}x (target >= 3x)")
            if "pyamg" in found:
                line += (f"; vs PyAMG CPU set-up + solve {found['pyamg']['total s'] / amg['total s']:.1f}x "
                         "(target >= 20x)")
            notes.append(line)
            print(line, flush=True)
        # after every problem: a cut run keeps its rows
        path = save(rows, notes, args.out, gpu, f"d{args.diffusion}_e{args.elasticity}")
    print(pathlib.Path(path).read_text())
    print(f"saved {path}", file=sys.stderr)
    return 0


def save(rows, notes, folder, gpu, sizes):
    """Write the table and notes so far under ``folder`` (``sizes`` names the problems); return the file's path."""
    commit = provenance.commit()
    stamp = provenance.stamp()
    text = (f"# Preconditioner benchmark, {stamp} UTC, {gpu}, commit {commit}\n\n"
            f"float64, rtol {RTOL:g}, random right-hand side; set-up and solve measured separately "
            "(see scripts/bench_precond.py for what each column holds); where AMG's hierarchy is built is in "
            "its rows (set-up gpu, or cpu: PyAMG, uploaded once).\n\n"
            + "\n".join(rows) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
    return provenance.save(folder, f"precond_{stamp}_{gpu.replace(' ', '_')}_{commit}_{sizes}.md", text)


if __name__ == "__main__":
    sys.exit(main())
