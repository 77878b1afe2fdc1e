"""Where an AMG-PCG iteration's time goes on the GPU: each launch of the V-cycle timed on its own.

Run on a GPU machine: ``python scripts/probe_amg.py [--diffusion N] [--elasticity N] [--config NAME ...]``.
For each configuration (smoother, hierarchy precision, coarse size) it sets up
AMG-PCG (the hierarchy built on the GPU), solves twice (float64, rtol 1e-8, a
random right-hand side) and reports the iterations and the time an iteration.
Then it lays the V-cycle out once more on its own buffers (a program that never
stops) and times, with CUDA events around replays of captured graphs:

* every launch alone: a graph of ``--repeat`` copies of it, replayed; the time a
  copy, which includes the ~1.4 us a graph kernel node costs, summed by what the
  launch is part of (level, smoothing, residual, transfer, coarsest solve);
* the whole V-cycle: one graph of the sequence, replayed.

The outer iteration (classic PCG split into three kernels) is the time an
iteration less the V-cycle's. Prints markdown tables and saves them under
``scripts/results/`` with the date, the GPU and the commit.
"""
import argparse
import collections
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import provenance  # noqa: E402
import solvers  # noqa: E402
from solvers import kernels  # noqa: E402
from bench_precond import problems  # noqa: E402  (the benchmark's problems, by the same names)
from solvers.pcg import AMG  # noqa: E402

RTOL = 1e-8
CONFIGS = {  # name -> AMG options (the defaults: Chebyshev degree 3, theta 0.1, float32 levels on the GPU)
    "default": {},
    "float64": dict(hierarchy_dtype="float64"),
    "degree2": dict(degree=2),
    "degree4": dict(degree=4),
    "jacobi": dict(smoother="jacobi"),
    "theta0": dict(theta=0.0),
    "coarse100": dict(coarse_size=100),
}


def graph_of(launch, stream, copies):
    """A captured graph of ``copies`` calls of ``launch(stream)``."""
    stream.begin_capture()
    for _ in range(copies):
        launch(stream)
    return stream.end_capture()


def replay_time(graph, stream, reps):
    """Seconds a replay of ``graph`` takes (median of ``reps`` event-timed replays, after one)."""
    import cupy
    graph.launch(stream)
    times = []
    for _ in range(reps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        graph.launch(stream)
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e-3)
    return float(np.median(times))


def breakdown(M, n, repeat, reps):
    """``(per-part seconds, per-part launches, V-cycle seconds, launches)`` of ``M``'s V-cycle."""
    import cupy
    from solvers.pcg.preconditioners.device import DeviceProgram

    r = cupy.asarray(np.random.default_rng(1).random(n))
    program = DeviceProgram(r, cupy.zeros(n), M.storage_dtype)
    M.device_apply(program)
    program.close()
    launches = program._launches
    labels = getattr(program, "labels", None) or [k.name if hasattr(k, "name") else str(k) for k, _, _ in launches]
    stream = cupy.cuda.Stream(non_blocking=True)
    parts, counts = collections.OrderedDict(), collections.Counter()
    for (kernel, grid, args), label in zip(launches, labels):
        def one(s, kernel=kernel, grid=grid, args=args):
            kernel((grid,), (256,), args, stream=s)
        seconds = replay_time(graph_of(one, stream, repeat), stream, reps) / repeat
        parts[label] = parts.get(label, 0.0) + seconds
        counts[label] += 1
    cycle = replay_time(graph_of(program.launch, stream, 1), stream, reps)
    return parts, counts, cycle, len(launches)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--diffusion", type=int, default=2048, metavar="N", help="diffusion grid side (0: skip)")
    ap.add_argument("--elasticity", type=int, default=0, metavar="N", help="elasticity grid side (0: skip)")
    ap.add_argument("--config", action="append", choices=sorted(CONFIGS),
                    help="configurations to run (repeatable; default all)")
    ap.add_argument("--breakdown", action="append", default=None,
                    help="configurations whose V-cycle is timed launch by launch (default: the first)")
    ap.add_argument("--repeat", type=int, default=10, help="copies of a launch in its timing graph")
    ap.add_argument("--reps", type=int, default=10, help="timed replays of each graph")
    ap.add_argument("--label", default="", help="added to the results file's name and title")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    import cupy

    configs = args.config or list(CONFIGS)
    detailed = set(args.breakdown or configs[:1])
    gpu = kernels.device_name()
    lines = []

    def say(text=""):
        print(text, flush=True)
        lines.append(text)

    for name, A, B in problems(args.diffusion, args.elasticity):
        n = A.shape[0]
        b = np.random.default_rng(0).random(n)
        say(f"## {name} (n = {n:,}, nnz = {A.nnz:,})")
        say()
        say("| config | levels | set-up s | iterations | solve s | us/it | V-cycle us (graph) | launches | "
            "outer us/it |")
        say("|---|---|---|---|---|---|---|---|---|")
        tables = []
        warm = AMG(near_nullspace=None if B is None else B[:2048], **CONFIGS[configs[0]])
        small = A[:2048, :2048].tocsr()
        solvers.PCG(small, preconditioner=warm, rtol=RTOL, device="gpu").solve(np.ones(2048))  # compiles
        for config in configs:
            t0 = time.perf_counter()
            solver = solvers.PCG(A, preconditioner=AMG(near_nullspace=B, **CONFIGS[config]), rtol=RTOL, device="gpu",
                                 maxiter=5000)
            setup = time.perf_counter() - t0
            solver.solve(b)
            res = solver.solve(b)
            per_it = res.loop_time / max(res.iterations, 1)
            M = solver._impl.M
            parts, counts, cycle, launches = breakdown(M, n, args.repeat if config in detailed else 1,
                                                       args.reps if config in detailed else 3)
            say(f"| {config} | {len(M.level_sizes())} | {setup:.3f} | {res.iterations} | {res.solve_time:.3f} | "
                f"{per_it * 1e6:.0f} | {cycle * 1e6:.0f} | {launches} | {(per_it - cycle) * 1e6:.0f} |")
            if config in detailed:
                sizes = ", ".join(f"{r:,}/{z:,}" for r, z in M.level_sizes())
                rows = [f"### {config}: launches timed alone (levels rows/nonzeros: {sizes})", "",
                        "| part | launches | us (each alone, in a graph) |", "|---|---|---|"]
                rows += [f"| {label or 'precision conversions'} | {counts[label]} | {sec * 1e6:.1f} |"
                         for label, sec in parts.items()]
                rows.append(f"| sum | {launches} | {sum(parts.values()) * 1e6:.1f} |")
                tables.append(rows)
            del solver, M
            cupy.get_default_memory_pool().free_all_blocks()
        for rows in tables:
            say()
            for row in rows:
                say(row)
        say()
    commit = provenance.commit()
    stamp = provenance.stamp()
    text = (f"# AMG V-cycle probe{(' ' + args.label) if args.label else ''}, {stamp} UTC, {gpu}, commit {commit}\n\n"
            f"`python scripts/probe_amg.py {' '.join(argv if argv is not None else sys.argv[1:])}`; float64 CG, "
            f"rtol {RTOL:g}, hierarchy built on the GPU.\n\n" + "\n".join(lines) + "\n")
    suffix = f"_{args.label}" if args.label else ""
    path = provenance.save(args.out, f"probe_amg_{stamp}_{gpu.replace(' ', '_')}_{commit}{suffix}.md", text)
    print(f"saved {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
