"""Smoothed-aggregation AMG set-up on the GPU against PyAMG's on the CPU, with the hierarchies side by side.

Problems (PyAMG's gallery): rotated anisotropic diffusion (epsilon 1e-3, theta pi/6) at 512^2,
1024^2 and 2048^2, and plane-strain linear elasticity at 1024^2 with its three rigid body modes
as the near-nullspace. Both set-ups stop coarsening at the plug-in's coarse size.

GPU columns (medians of ``--reps`` runs, the matrix already on the device, CUDA and CuPy warmed
up on a small problem first so no compilation is timed):
- ``hierarchy``: :func:`build_hierarchy`: strength, aggregation, tentative and smoothed
  prolongators, Galerkin products, coarsest inverse;
- ``aggregation``: the finest level's MIS(2) aggregation alone;
- ``reuse``: the same with the aggregation kept (what ``update_values`` does);
- ``AMG.setup``: the plug-in's whole set-up on the device matrix (adds each level's smoother
  estimate).
Below the table, where the finest level's set-up spends its time, step by step.
PyAMG: one ``smoothed_aggregation_solver`` call (its defaults but ``max_coarse``), skipped above
``--pyamg-max-rows`` rows (it takes about a minute at 2048^2).
"""
import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import provenance  # noqa: E402
from solvers import kernels  # noqa: E402
from solvers.gallery import linear_elasticity_2d, rotated_anisotropic_diffusion  # noqa: E402
from solvers.pcg.preconditioners.amg import AMG, COARSE_ROWS, default_coarse_size  # noqa: E402
from solvers.pcg.preconditioners.amg_gpu_setup import (aggregate, build_hierarchy, device_backend,  # noqa: E402
                                                       smoothed_prolongator, tentative_prolongator)
from solvers.pcg.preconditioners.spectrum import LANCZOS_STEPS, largest_scaled_eigenvalue  # noqa: E402

PROBLEMS = {
    "diffusion 512^2": lambda: (rotated_anisotropic_diffusion((512, 512)), None),
    "diffusion 1024^2": lambda: (rotated_anisotropic_diffusion((1024, 1024)), None),
    "diffusion 2048^2": lambda: (rotated_anisotropic_diffusion((2048, 2048)), None),
    "elasticity 1024^2": lambda: linear_elasticity_2d((1024, 1024)),
}


def median_seconds(run, reps, sync):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def finest_level_steps(Ad, Bd, backend, reps, sync):
    """Median milliseconds of each step of the finest level's set-up, as text."""
    xp = backend.xp
    B = xp.ones((Ad.shape[0], 1)) if Bd is None else Bd
    aggregates, count = aggregate(Ad, 0.0, backend)
    T, _ = tentative_prolongator(aggregates, count, 1, B, backend)
    P, _ = smoothed_prolongator(Ad, T, LANCZOS_STEPS, backend)
    R = P.T.tocsr()
    AP = backend.product(Ad, P)
    inverse_diagonal = 1.0 / Ad.diagonal()
    steps = {
        "aggregation": lambda: aggregate(Ad, 0.0, backend),
        "tentative P (QR)": lambda: tentative_prolongator(aggregates, count, 1, B, backend),
        "rho (Lanczos)": lambda: largest_scaled_eigenvalue(Ad, inverse_diagonal, LANCZOS_STEPS),
        "A T": lambda: backend.product(Ad, T),
        "smoothed P (rho, A T, kernel)": lambda: smoothed_prolongator(Ad, T, LANCZOS_STEPS, backend),
        "P^T": lambda: P.T.tocsr(),
        "A P": lambda: backend.product(Ad, P),
        "R (A P)": lambda: backend.product(R, AP),
    }
    return ", ".join(f"{name} {median_seconds(step, reps, sync) * 1e3:.1f}" for name, step in steps.items())


def attempt(measure):
    """``measure()``, or the error it raised as text (a secondary figure failing keeps the row's others)."""
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 -- recorded in the table, not hidden
        return f"failed: {type(exc).__name__}: {exc}".replace("|", "/")


def complexities(sizes):
    """``(levels, operator complexity, grid complexity)`` from ``(rows, nonzeros)`` per level."""
    rows, nnz = zip(*sizes)
    return len(sizes), sum(nnz) / nnz[0], sum(rows) / rows[0]


def level_text(sizes):
    return " / ".join(f"{rows:,}" for rows, _ in sizes)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", nargs="*", help="problem names to run (substring match)")
    ap.add_argument("--pyamg-max-rows", type=int, default=1_100_000,
                    help="time PyAMG's set-up only up to this many rows (default 1,100,000)")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    import cupy
    import cupyx.scipy.sparse as csp
    import pyamg

    backend = device_backend()
    sync = cupy.cuda.Device().synchronize
    warm_A = csp.csr_matrix(rotated_anisotropic_diffusion((64, 64)))
    build_hierarchy(warm_A, None, backend, coarse_size=default_coarse_size(1))
    AMG().setup(warm_A)
    gpu = kernels.device_name()
    header = ("| problem | rows | nonzeros | GPU hierarchy ms | GPU aggregation ms | GPU reuse ms | GPU AMG.setup ms "
              "| PyAMG set-up s | PyAMG / GPU hierarchy | PyAMG levels (rows) | PyAMG op. / grid complexity "
              "| GPU levels (rows) | GPU op. / grid complexity |")
    rows, notes = [header, "|" + "---|" * (header.count("|") - 1)], []
    for name, make in PROBLEMS.items():
        if args.only and not any(o in name for o in args.only):
            continue
        A, B = make()
        print(f"{name}: n={A.shape[0]:,} nnz={A.nnz:,}", file=sys.stderr, flush=True)
        Ad, Bd = csp.csr_matrix(A), None if B is None else cupy.asarray(B)
        coarse_size = default_coarse_size(1 if B is None else B.shape[1])
        built = build_hierarchy(Ad, Bd, backend, coarse_size=coarse_size)
        t_build = median_seconds(lambda: build_hierarchy(Ad, Bd, backend, coarse_size=coarse_size), args.reps, sync)
        t_aggregate = median_seconds(lambda: aggregate(Ad, 0.0, backend), args.reps, sync)
        t_reuse = median_seconds(lambda: build_hierarchy(Ad, Bd, backend, coarse_size=coarse_size,
                                                         reuse=built.structure), args.reps, sync)
        plugin_s = attempt(lambda: median_seconds(lambda: AMG(near_nullspace=B).setup(Ad), args.reps, sync))
        plugin_ms = f"{plugin_s * 1e3:.1f}" if isinstance(plugin_s, float) else plugin_s
        ours = [(M.shape[0], int(M.nnz)) for M in built.operators]
        levels, oc, gc = complexities(ours)
        if A.shape[0] <= args.pyamg_max_rows:
            t0 = time.perf_counter()
            ml = pyamg.smoothed_aggregation_solver(A, B=B, max_coarse=coarse_size)
            t_pyamg = time.perf_counter() - t0
            theirs = [(lvl.A.shape[0], int(lvl.A.nnz)) for lvl in ml.levels]
            _, poc, pgc = complexities(theirs)
            pyamg_cols = (f"{t_pyamg:.2f} | {t_pyamg / t_build:.1f}x | {level_text(theirs)} "
                          f"| {poc:.3f} / {pgc:.3f}")
        else:
            pyamg_cols = "not run | - | - | -"
        rows.append(f"| {name} | {A.shape[0]:,} | {A.nnz:,} | {t_build * 1e3:.1f} | {t_aggregate * 1e3:.1f} "
                    f"| {t_reuse * 1e3:.1f} | {plugin_ms} | {pyamg_cols} | {level_text(ours)} "
                    f"| {oc:.3f} / {gc:.3f} |")
        steps = attempt(lambda: finest_level_steps(Ad, Bd, backend, args.reps, sync))
        notes.append(f"- {name}, finest level (ms): {steps}")
        print(rows[-1], notes[-1], sep="\n", flush=True)
        Ad = Bd = built = None  # the device memory goes back to the pool
        cupy.get_default_memory_pool().free_all_blocks()
        path = save(rows + [""] + notes, args.out, gpu, args)  # after every problem: a cut run keeps its rows
    print(pathlib.Path(path).read_text())
    print(f"saved {path}", file=sys.stderr)
    return 0


def save(rows, folder, gpu, args):
    """Write the table so far under ``folder``; return the file's path."""
    commit = provenance.commit()
    stamp = provenance.stamp()
    text = (f"# AMG set-up benchmark, {stamp} UTC, {gpu}, commit {commit}\n\n"
            f"float64; coarsening stops at {COARSE_ROWS:,} rows' worth of nodes (default_coarse_size); GPU times are medians of {args.reps} runs "
            f"after a warm-up (see the script's docstring for the columns); PyAMG timed once, up to "
            f"{args.pyamg_max_rows:,} rows.\n\n" + "\n".join(rows) + "\n")
    return provenance.save(folder, f"amg_setup_{stamp}_{gpu.replace(' ', '_')}_{commit}.md", text)


if __name__ == "__main__":
    sys.exit(main())
