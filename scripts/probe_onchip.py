"""Where an on-chip PCG iteration's time goes: layouts side by side, and the cost of its parts.

Run on a GPU machine::

    python scripts/probe_onchip.py layouts [--iterations 300]
    python scripts/probe_onchip.py costs [--iterations 300] [--matrices gr_900_900_crg,...]
    python scripts/probe_onchip.py batch [--systems 10000] [--shapes 256x4x3,128x8x3,...]

``layouts`` times each small matrix at several on-chip layouts (block threads,
rows a thread, blocks a cluster), the layout forced in place of
:func:`solvers.pcg.onchip.latency_shape`, in both PCG variants. ``costs`` times the kernel as it is
against altered copies made here (never shipped) and other settings: without the
per-iteration record of the State and progress word; with the reduction the
decision follows done twice (the same result, one reduction more); with every
warp adding the warps' totals and every thread the cluster's (as at commit
7632314) instead of warp 0 handing its sums to the block; with no matrix entries
held in registers; single-reduction PCG (one reduction an iteration) instead of
classic. The differences are what those parts
cost. Every figure: float64, Jacobi, while mode, the whole solve one launch,
rtol 0 and a fixed number of iterations, best of three, us per iteration.
``batch`` times :class:`solvers.BatchedPCG` on the benchmark's batch (``bench_small.problem``: 32x32
variable-coefficient diffusion systems, rtol 1e-8) at forced layouts: block threads, rows a thread
and the blocks an SM the kernel is compiled for (``min_blocks``, which caps its registers); it
prints the whole ``solve`` and the kernel alone (CUDA events around its launch), best of five, in ms.
"""
import argparse
import contextlib
import itertools
import pathlib
import sys

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import solvers  # noqa: E402
import solvers.kernels as kernels  # noqa: E402
import solvers.pcg.onchip as onchip  # noqa: E402
from solvers.gallery import poisson, power_law_laplacian, random_geometric_laplacian  # noqa: E402
from solvers.mmio import read_matrix  # noqa: E402

DATA = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "matrices"
LAYOUTS = {  # (block threads, rows a thread, blocks a cluster[, clusters: single-reduction only])
    "gr_900_900_crg": [(480, 2, 1), (256, 4, 1), (320, 3, 1), (128, 8, 1)],
    "1138_bus": [(384, 3, 1), (256, 5, 1), (288, 4, 1), (192, 6, 1), (576, 2, 1), (640, 2, 1)],
    "2D Poisson 48^2": [(160, 1, 15), (512, 1, 5)],
    "2D Poisson 64^2": [(512, 1, 8), (256, 2, 8), (256, 1, 16), (128, 4, 8)],
    "lap2D_5pt_n100": [(512, 2, 10), (256, 4, 10), (256, 3, 14), (320, 2, 16), (336, 2, 15), (640, 1, 16)],
    "2D Poisson 128^2": [(512, 2, 16), (256, 4, 16), (1024, 1, 16), (512, 1, 16, 2)],
    "2D Poisson 130^2": [(1024, 2, 9), (544, 1, 16, 2)],
    "2D Poisson 160^2": [(1024, 2, 13), (544, 1, 16, 3)],
    "2D Poisson 256^2": [(1024, 4, 16), (608, 1, 16, 7), (320, 2, 16, 7), (576, 1, 8, 15)],
}
RECORD = "        if (sr.recorder) record_decision(sr.st, it, rnorm, status, a.history, a.progress, sr.handle);"
REDUCTION = "        team_sums(sums, sr.sc, sr.round);\n        ++it;\n"  # the decision's reduction, either variant
SUMS_BEGIN = "// Sums of K <= 3 values over the team"
# team_sums as measured at 7632314: every warp adds the warps' totals and, in a team, every thread
# waits on the mbarrier and adds the team's totals in rank order
EVERY_WARP_SUMS = """// Sums of K <= 3 values over the team, the same bits in every thread; `round` counts the reductions.
// Also a barrier of the team for the shared memory accessed before and after the call.
template <int K>
__device__ __forceinline__ void team_sums(double (&v)[K], TeamScratch& sc, int& round) {
    const int buf = round & 1;
    const unsigned parity = (unsigned)(round >> 1) & 1u;  // of this buffer's mbarrier phase
    ++round;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = warp_total(v[k]);
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) sc.warp[buf][k][warp] = v[k];
    }
    __syncthreads();
#if ONCHIP_TEAM > 1
    if (warp == 0) {  // the block's totals, pushed by lane c into block c
#pragma unroll
        for (int k = 0; k < K; ++k) v[k] = warp_total(lane < ONCHIP_WARPS ? sc.warp[buf][k][lane] : 0.0);
        if (lane == 0) expect_bytes(&sc.arrived[buf], ONCHIP_TEAM * K * sizeof(double));
        if (lane < ONCHIP_TEAM) {
            const unsigned me = team_rank();
#pragma unroll
            for (int k = 0; k < K; ++k) push(&sc.team[buf][k][me], v[k], &sc.arrived[buf], lane);
        }
    }
    wait_phase(&sc.arrived[buf], parity);
#pragma unroll
    for (int k = 0; k < K; ++k) {
        double t = 0.0;
#pragma unroll
        for (int c = 0; c < ONCHIP_TEAM; ++c) t += sc.team[buf][k][c];
        v[k] = t;
    }
#else
    (void)parity;
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = warp_total(lane < ONCHIP_WARPS ? sc.warp[buf][k][lane] : 0.0);
#endif
}
"""


def without_record(text):
    return text.replace(RECORD, RECORD.replace("(sr.recorder)", "(sr.recorder && status != RUNNING)"))


def reduction_twice(text):
    again = ("        { double again[sizeof(sums) / sizeof(double)];\n"
             "          for (int k = 0; k < (int)(sizeof(sums) / sizeof(double)); ++k) again[k] = sums[k];\n"
             "          team_sums(again, sr.sc, sr.round); }\n")
    return text.replace(REDUCTION, again + REDUCTION)


def every_warp_sums(text):
    begin = text.find(SUMS_BEGIN)
    end = text.find("\n}\n", begin)
    return text if begin < 0 or end < 0 else text[:begin] + EVERY_WARP_SUMS + text[end + 3:]


@contextlib.contextmanager
def nothing_held():
    held = onchip.held_entries
    onchip.held_entries = lambda *args: 0
    try:
        yield
    finally:
        onchip.held_entries = held


# label: (kernel text alteration, solver options, context while setting up)
COSTS = {
    "as it is": (None, {}, contextlib.nullcontext),
    "without the per-iteration record": (without_record, {}, contextlib.nullcontext),
    "the decision's reduction twice": (reduction_twice, {}, contextlib.nullcontext),
    "totals added in every warp (7632314)": (every_warp_sums, {}, contextlib.nullcontext),
    "no entries in registers": (None, {}, nothing_held),
    "single-reduction PCG": (None, {"variant": "single-reduction"}, contextlib.nullcontext),
}


def matrix(name):
    if name.startswith("power-law"):  # graph Laplacians of solvers.gallery: "power-law 2000", "geometric 8000"
        return power_law_laplacian(int(name.split()[-1]))
    if name.startswith("geometric"):
        return random_geometric_laplacian(int(name.split()[-1]))
    if name.startswith("star"):  # "star 1000 60": a path of 1,000 vertices, its middle joined to 60 others
        n, spokes = (int(v) for v in name.split()[1:])
        others = np.random.default_rng(0).choice(np.delete(np.arange(n), n // 2), spokes, replace=False)
        edges = sp.coo_matrix((np.ones(spokes), (np.full(spokes, n // 2), others)), shape=(n, n))
        path = sp.diags([np.ones(n - 1), np.ones(n - 1)], [-1, 1])
        adjacency = (path + edges + edges.T).tocsr()
        return (sp.diags(np.asarray(adjacency.sum(axis=1)).ravel() + 1e-2) - adjacency).tocsr()
    if name.startswith("2D Poisson"):
        side = int(name.split()[-1].split("^")[0])
        return poisson((side, side))
    return read_matrix(str(DATA / f"{name}.mtx"))


def per_iteration(A, iterations, **options):
    """The on-chip layout's description and the best us per iteration of three solves."""
    b = np.random.default_rng(0).standard_normal(A.shape[0])
    solver = solvers.PCG(A, device="gpu", mode="while", path="on-chip", unroll=iterations + 1, rtol=0.0,
                         maxiter=iterations, reorder="none", **options)
    solver.solve(b)  # warm-up: compile and capture
    return f"{solver.variant}, {solver.format}", min(solver.solve(b).loop_time for _ in range(3)) / iterations * 1e6


def layouts(iterations, names):
    shape_of = onchip.latency_shape
    for name, shapes in LAYOUTS.items():
        if names and name not in names:
            continue
        A = matrix(name)
        for shape, variant in itertools.product(shapes, onchip.VARIANTS):
            if len(shape) > 3 and variant == "classic":
                continue  # classic PCG stays inside one cluster
            onchip.latency_shape = lambda rows, pattern=None, spread=True, s=shape: onchip.Shape(*s)
            try:
                layout, us = per_iteration(A, iterations, variant=variant)
                print(f"| {name} | {shape} | {layout} | {us:.2f} |", flush=True)
            except solvers.InputError as exc:
                print(f"| {name} | {shape} | {variant} refused: {exc} | |", flush=True)
    onchip.latency_shape = shape_of


def costs(iterations, names):
    source = kernels.source
    text = source("onchip")
    for label, (alter, options, context) in COSTS.items():
        altered = alter(text) if alter else text
        if alter and altered == text:
            raise SystemExit(f"probe_onchip: the kernel no longer has the code {label!r} alters")
        kernels.source = lambda name, t=altered: t if name == "onchip" else source(name)
        for name in names or ("gr_900_900_crg", "2D Poisson 64^2", "2D Poisson 128^2"):
            A = matrix(name)
            with context():
                layout, us = per_iteration(A, iterations, **options)
            print(f"| {label} | {name} | {layout} | {us:.2f} |", flush=True)
    kernels.source = source


def batch(systems, shapes):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import bench_small
    pattern, values, b = bench_small.problem(systems, 32)
    candidates, sm_shared = onchip.candidate_shapes, onchip.SM_SHARED
    for text in shapes:
        block, rows, min_blocks = (int(v) for v in text.split("x"))
        shape = onchip.Shape(block, rows, 1)
        onchip.candidate_shapes = lambda *args, s=shape, **kwargs: [s]
        layout = onchip.choose_layout(pattern.indptr, np.array([0, pattern.shape[0]]), 8, False)
        need = onchip.layout_bytes(layout, layout.in_shared, 8, "classic") + 1024
        onchip.SM_SHARED = min_blocks * need  # what makes OnChipKernel compile for min_blocks blocks an SM
        kernel_ms = []
        with kernel_timed(kernel_ms):
            try:
                seconds, _, iterations, worst, path = bench_small.bench_ours(pattern, values, b, 5)
            finally:
                onchip.candidate_shapes, onchip.SM_SHARED = candidates, sm_shared
        print(f"| {text} | {path} | {iterations} | {worst:.1e} | {seconds * 1e3:.2f} | {min(kernel_ms):.2f} | "
              f"{systems / seconds:,.0f} |", flush=True)


@contextlib.contextmanager
def kernel_timed(times):
    """Record each on-chip launch's ms (CUDA events around it, read after the launch) into ``times``."""
    import cupy
    launch = onchip.OnChipKernel.launch

    def timed(self, args, handle=0, stream=None):
        begin, end = cupy.cuda.Event(), cupy.cuda.Event()
        begin.record(stream)
        launch(self, args, handle, stream)
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(begin, end))
    onchip.OnChipKernel.launch = timed
    try:
        yield
    finally:
        onchip.OnChipKernel.launch = launch


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("layouts", "costs", "batch"))
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--matrices", default="", help="comma-separated names (default: the mode's own list)")
    ap.add_argument("--systems", type=int, default=10000)
    ap.add_argument("--shapes", default="256x4x2,256x4x3,128x8x3",
                    help="batch layouts: block threads x rows a thread x blocks an SM, comma-separated")
    args = ap.parse_args(argv)
    names = [n for n in args.matrices.split(",") if n]
    if args.what == "batch":
        batch(args.systems, args.shapes.split(","))
    else:
        (layouts if args.what == "layouts" else costs)(args.iterations, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
