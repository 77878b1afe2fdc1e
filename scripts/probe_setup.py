"""Where a GPU solver's set-up time goes: each stage of ``PCG(A, ...)`` timed with the device synchronised.

Run on a GPU machine: ``python scripts/probe_setup.py [--diffusion N] [--elasticity N] [--methods jacobi,amg]
[--graphs "geometric 50k,power-law 1000k"]``.
For each of the benchmark's problems (``scripts/bench_precond.py``, the same names
and sizes; with ``--graphs``, :mod:`solvers.gallery`'s graph Laplacians named as in
``scripts/bench_pcg.py``) and each method it sets the solver up ``--reps`` times after the
benchmark's warm-up (one set-up and solve of each, so kernel compilation is not counted), with
the set-up's stages wrapped: each wrapped call synchronises the device before and
after, so its time is the device work it launched as well as its host work. The
times are inclusive (a stage contains the stages it calls) and are the medians
over the repetitions; ``calls`` is the count in one set-up. The synchronisations
add a little to the total, which is printed beside the plain (unwrapped) set-up.
The wrapped set-up of the last repetition also runs under cProfile, whose top
functions by cumulative time follow each table, and a plain set-up under cProfile gives
the host's own time by function (what the set-up costs on the host, with the reads
back that wait for the device). The matrix format's conversion (``GPUPCG.format_time``)
of each plain set-up is printed too. Prints markdown and saves it
under ``scripts/results/`` with the date, the GPU and the commit.
"""
import argparse
import collections
import cProfile
import functools
import importlib
import io
import pathlib
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import provenance  # noqa: E402
import solvers  # noqa: E402
from solvers import kernels  # noqa: E402
from bench_precond import METHODS, RTOL, problems, warm_up  # noqa: E402

#: ``module:attribute`` paths of the stages timed (functions, or ``Class.method``).
STAGES = (
    "solvers.pcg.solver:choose_reordering",
    "solvers.pcg.solver:PCG._where_solved",
    "solvers.pcg.solver:PCG._shift_for",
    "solvers.pcg.onchip:choose_path",
    "solvers.pcg.gpu:to_device_csr",
    "solvers.pcg.gpu:GPUPCG._setup",
    "solvers.pcg.gpu:choose_format",
    "solvers.pcg.gpu:GPUPCG._set_diagonal",
    "solvers.pcg.gpu:GPUPCG._set_up_preconditioner",
    "solvers.pcg.gpu:GPUPCG._lay_out_preconditioner",
    "solvers.pcg.gpu:GPUPCG._pack_args",
    "solvers.engine:GraphEngine.__init__",
    "solvers.kernels:module",
    "solvers.kernels:resident_blocks",
    "solvers.pcg.preconditioners.amg:AMG._candidates",
    "solvers.pcg.preconditioners.amg:AMG._device_hierarchy",
    "solvers.pcg.preconditioners.amg:AMG._smoother",
    "solvers.pcg.preconditioners.amg_gpu_setup:build_on_device",
    "solvers.pcg.preconditioners.amg_gpu_setup:build_hierarchy",
    "solvers.pcg.preconditioners.amg_gpu_setup:node_matrix",
    "solvers.pcg.preconditioners.amg_gpu_setup:aggregate",
    "solvers.pcg.preconditioners.amg_gpu_setup:independent_set",
    "solvers.pcg.preconditioners.amg_gpu_setup:tentative_prolongator",
    "solvers.pcg.preconditioners.amg_gpu_setup:smoothed_prolongator",
    "solvers.pcg.preconditioners.amg_gpu_setup:largest_scaled_eigenvalue",
    "solvers.pcg.preconditioners.amg_gpu_setup:DeviceBackend.product",
    "solvers.pcg.preconditioners.amg_gpu_setup:dense_pseudo_inverse",
    "solvers.pcg.preconditioners.amg_gpu_setup:device_backend",
    "solvers.pcg.preconditioners.smoothers:largest_scaled_eigenvalue",
    "solvers.pcg.preconditioners.device:DeviceMatrix.__init__",
    "solvers.pcg.preconditioners.device:choose_format",
    "solvers.formats:pattern_stats",
    "solvers.formats.sell:SELL._build",
    "solvers.formats.sell:SELL._lay_out",
    "solvers.formats.sell:SELL._cut_pieces",
    "solvers.formats.sell:SELL._place_entries",
    "solvers.formats.sell:SELL._sector_ratios",
    "solvers.formats.sell:LayoutBuild.__init__",
    "solvers.formats.sell:LayoutBuild.run",
    "solvers.formats.base:MatrixFormat.values",
)
#: ``--graphs`` names: :mod:`solvers.gallery` graph Laplacians as ``scripts/bench_pcg.py`` names them.
GRAPHS = {"geometric 50k": ("random_geometric_laplacian", 50_000),
          "power-law 100k": ("power_law_laplacian", 100_000),
          "geometric 2000k": ("random_geometric_laplacian", 2_000_000),
          "power-law 1000k": ("power_law_laplacian", 1_000_000)}


class StageTimer:
    """Wraps :data:`STAGES` so that each call is timed between two device synchronisations."""

    def __init__(self, paths):
        import cupy
        self.sync = cupy.cuda.Device().synchronize
        self.seconds, self.calls, self.active = collections.defaultdict(float), collections.Counter(), False
        self._saved = []
        for path in paths:
            module_name, attribute = path.split(":")
            owner = importlib.import_module(module_name)
            *outer, name = attribute.split(".")
            for part in outer:
                owner = getattr(owner, part, None)
            original = getattr(owner, name, None) if owner is not None else None
            if original is None:  # a stage the code under test no longer has
                continue
            self._saved.append((owner, name, original))
            setattr(owner, name, self._wrap(original, path.split(":")[1] + f" ({module_name.rsplit('.', 1)[-1]})"))

    def _wrap(self, function, label):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            if not self.active:
                return function(*args, **kwargs)
            self.sync()
            t0 = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.sync()
                self.seconds[label] += time.perf_counter() - t0
                self.calls[label] += 1
        return timed

    def restore(self):
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)


def set_up(A, preconditioner, conversions=None):
    """Seconds of one plain set-up of the GPU solver (the solver is dropped); its format's conversion is
    appended to ``conversions``."""
    import cupy
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    solver = solvers.PCG(A, preconditioner=preconditioner, rtol=RTOL, device="gpu")
    cupy.cuda.Device().synchronize()
    seconds = time.perf_counter() - t0
    if conversions is not None:
        conversions.append(solver._impl.format_time)
    del solver
    cupy.get_default_memory_pool().free_all_blocks()
    return seconds


def graphs(names):
    """``(name, A, None)`` of each ``--graphs`` name (:data:`GRAPHS`)."""
    from solvers import gallery
    for name in names:
        generator, n = GRAPHS[name]
        yield name, getattr(gallery, generator)(n), None


def profile_block(profile, order, top):
    """The ``top`` rows of a cProfile by ``order`` (a pstats sort key), as the lines of a fenced block."""
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats(order).print_stats(top)
    rows = [row.rstrip()[:180] for row in text.getvalue().splitlines()
            if row.strip() and not row.startswith(("   Ordered by", "   List reduced"))]
    return ["```", *rows, "```"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--diffusion", type=int, default=2048, metavar="N", help="diffusion grid side (0: skip)")
    ap.add_argument("--elasticity", type=int, default=1024, metavar="N", help="elasticity grid side (0: skip)")
    ap.add_argument("--methods", default="jacobi,amg", help=f"comma-separated, of {', '.join(METHODS)}")
    ap.add_argument("--graphs", default="", help=f"comma-separated, of {', '.join(GRAPHS)} (Jacobi only)")
    ap.add_argument("--reps", type=int, default=3, help="set-ups measured of each kind")
    ap.add_argument("--top", type=int, default=40, help="cProfile lines printed")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    names = args.methods.split(",")
    unknown = [name for name in names if name not in METHODS]
    if unknown:
        ap.error(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    graph_names = [name for name in args.graphs.split(",") if name]
    unknown = [name for name in graph_names if name not in GRAPHS]
    if unknown:
        ap.error(f"--graphs: unknown {', '.join(unknown)}; choose from {', '.join(GRAPHS)}")
    import cupy

    gpu = kernels.device_name()
    lines = []

    def say(text=""):
        print(text, flush=True)
        lines.append(text)

    cases = [(problem, A, B, names) for problem, A, B in problems(args.diffusion, args.elasticity)]
    cases += [(problem, A, B, ["jacobi"]) for problem, A, B in graphs(graph_names)]
    for problem, A, B, methods in cases:
        warm_up([(problem, A, B)], "gpu", methods)
    timer = StageTimer(STAGES)
    try:
        for problem, A, B, methods in cases:
            for name in methods:
                label, make = METHODS[name]
                conversions = []
                plain = sorted(set_up(A, make(B, "gpu"), conversions) for _ in range(args.reps))
                own = cProfile.Profile()
                own.enable()
                set_up(A, make(B, "gpu"))
                own.disable()
                runs = []
                for rep in range(args.reps):
                    timer.seconds.clear()
                    timer.calls.clear()
                    profile = cProfile.Profile() if rep == args.reps - 1 else None
                    timer.active = True
                    if profile:
                        profile.enable()
                    total = set_up(A, make(B, "gpu"))
                    if profile:
                        profile.disable()
                    timer.active = False
                    runs.append((total, dict(timer.seconds), dict(timer.calls)))
                say(f"## {problem} (n = {A.shape[0]:,}, nnz = {A.nnz:,}): {label}")
                say()
                say(f"plain set-up s: {', '.join(f'{s:.4f}' for s in plain)}; wrapped (synchronised): "
                    f"{', '.join(f'{t:.4f}' for t, _, _ in runs)}; format conversion ms (plain set-ups): "
                    f"{', '.join(f'{1e3 * c:.2f}' for c in conversions)}")
                say()
                say("| stage (inclusive) | calls | ms (median) |")
                say("|---|---|---|")
                stages = sorted(runs[-1][1], key=lambda s: -np.median([r[1].get(s, 0.0) for r in runs]))
                for stage in stages:
                    say(f"| {stage} | {runs[-1][2][stage]} | {1e3 * np.median([r[1].get(stage, 0.0) for r in runs]):.1f} |")
                say()
                for line in profile_block(profile, "cumulative", args.top):
                    say(line)
                say()
                say("A plain set-up, the host's own time by function:")
                say()
                for line in profile_block(own, "tottime", args.top):
                    say(line)
                say()
                cupy.get_default_memory_pool().free_all_blocks()
    finally:
        timer.restore()
    commit = provenance.commit()
    stamp = provenance.stamp()
    text = (f"# GPU solver set-up probe, {stamp} UTC, {gpu}, commit {commit}\n\n"
            f"`python scripts/probe_setup.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n\n"
            + "\n".join(lines) + "\n")
    path = provenance.save(args.out, f"probe_setup_{stamp}_{gpu.replace(' ', '_')}_{commit}.md", text)
    print(f"saved {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
