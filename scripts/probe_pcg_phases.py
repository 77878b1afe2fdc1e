"""Where the persistent PCG kernel's iteration goes, and what staging the matrix changes.

Run on a GPU machine: ``python scripts/probe_pcg_phases.py [--only NAME ...] [--out DIR]``.
For each matrix (random geometric graph 50k rows, power-law graph 100k and 1M rows),
with the matrix staged in shared memory (as the solver does it, where all of it
fits) and without, one iteration's time of ``auto``'s PCG variant (while mode,
Jacobi, float64, 32 iterations a launch, fastest of three solves of ITERATIONS).
Then, with clock marks compiled into a copy of the kernel (``MARKS``), the
iteration's phases: cycles a warp spends in each, the mean over the grid's warps.
The marks cost a little time of their own (the timings come from the unmarked
kernels), and a warp that leaves a grid reduction early (every warp but the first
of its block) waits for the totals in the next phase, at the block barrier there.

``--blocks``: instead of the phases (saved as ``probe_pcg_blocks_...``), the classic
kernel's product (stored gather) timed per warp and reported by block (a block's slowest
warp, the slowest blocks and their SMs), once with the work dealt as ``WorkItems`` deals it
and once with its warps numbered backwards (the first warps take what the last took): slow
blocks that move with the work are slow for their work, not for their SM.

``--ncu``: no timings; one eager solve of the named matrix (the ``auto`` choices),
for ``ncu -k regex:pcg`` to profile a launch of the persistent kernel.

Prints markdown tables as it goes and saves them under ``scripts/results/`` (or
``--out``) with the date, the GPU and the commit.
"""
import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import provenance  # noqa: E402
from probe_formats import ITERATIONS, results_log, timed_solves  # noqa: E402
import solvers.kernels as kernels  # noqa: E402
import solvers.pcg.gpu as pcg_gpu  # noqa: E402
from solvers.gallery import power_law_laplacian, random_geometric_laplacian  # noqa: E402

MATRICES = (("geometric 50k", lambda: random_geometric_laplacian(50_000)),
            ("power-law 100k", lambda: power_law_laplacian(100_000)),
            ("power-law 1000k", lambda: power_law_laplacian(1_000_000)))
# name: the matrix staged in shared memory (as the solver does it: where all of it fits), or not
VARIANTS = {"as loaded": False, "staged": True}

# Clock marks (text of kernels/pcg.cu, its occurrence, the mark's phase, the mark before or after it).
# Classic with a stored gather: 0 direction pass, 1 barrier, 2 product, 3 reduction, 4 decision,
# 5 update pass, 6 reduction, 7 decision; single-reduction, stored: 0 row pass, 1 barrier, 2 product,
# 3 reduction, 4 decision.
MARK = "{ const long long now_ = clock64(); phase_[%d] += now_ - then_; then_ = now_; }"
PHASES = {"classic": ("direction pass", "barrier", "product", "reduction p.q", "decision", "update pass",
                      "reduction r.z, r.r", "decision, settle"),
          "single-reduction": ("row pass", "barrier", "product", "reduction", "decision, settle")}
FLUSH = ("if ((threadIdx.x & 31) == 0) for (int k_ = 0; k_ < 8; ++k_) "
         "atomicAdd(&phase_cycles[k_], (unsigned long long)phase_[k_]); ")
MARKS = (("                grid_barrier(a.arrivals, tag);", 0, 0, "before"),
         ("                grid_barrier(a.arrivals, tag);", 0, 1, "after"),
         ("pq[0] = stored_product(a.A, stage, p_new, a.q);", 0, 2, "after"),
         ("grid_sums<RUN_BLOCK>(a.slots, a.arrivals, pq, tag);", 0, 3, "after"),
         ("if (s.status != RUNNING) break;", 0, 4, "after"),
         ("n, sums[0], sums[1]);", 0, 5, "after"),
         ("grid_sums<RUN_BLOCK>(a.slots, a.arrivals, sums, tag);", 0, 6, "after"),
         ("updated_and_stopped = !start && s.status != RUNNING;", 0, 7, "after"),
         ("single_reduction_pointwise(a, s, sums);", 0, 0, "after"),
         ("            grid_barrier(a.arrivals, tag);\n            real_t* w_new", 0, 1, "after-line"),
         ("            });\n        } else {", 0, 2, "after-line"),
         ("grid_sums<RUN_BLOCK>(a.slots, a.arrivals, sums, tag);", 1, 3, "after"),
         ("        __syncthreads();\n    }\n    end_epoch", 0, 4, "after-line"))


def marked(text):
    """kernels/pcg.cu with clock marks in both persistent kernels (fails loudly if the text moved)."""
    for anchor, occurrence, phase, where in reversed(MARKS):  # from the end: earlier offsets stay valid
        at = -1
        for _ in range(occurrence + 1):
            at = text.index(anchor, at + 1)
        mark = MARK % phase
        if where == "before":
            text = text[:at] + mark + text[at:]
        elif where == "after":
            text = text[:at + len(anchor)] + " " + mark + text[at + len(anchor):]
        else:  # after the anchor's first line
            end = text.index("\n", at) + 1
            text = text[:end] + mark + "\n" + text[end:]
    text = text.replace("unsigned int tag = *a.epoch;",
                        "unsigned int tag = *a.epoch; long long phase_[8] = {0}; long long then_ = clock64();")
    text = text.replace("    end_epoch(a.epoch, tag);", "    " + FLUSH + "end_epoch(a.epoch, tag);")
    return "__device__ unsigned long long phase_cycles[8];\n" + text


class Variant:
    """The solver without staging (unless ``staged``), the kernel files' text passed through
    ``patch(name, text)`` where given, and then the compiled module kept (:attr:`module`); undone on exit."""

    def __init__(self, staged, patch=None):
        self.staged, self.patch = staged, patch
        self.module = None

    def __enter__(self):
        self._saved = (pcg_gpu.stage_bytes, kernels.source, kernels.module)
        _, source, module = self._saved
        if not self.staged:
            pcg_gpu.stage_bytes = lambda *args: 0
        if self.patch:
            kernels.source = lambda name: self.patch(name, source(name))

            def keep(*args, **kw):
                self.module = module(*args, **kw)
                return self.module
            kernels.module = keep
        return self

    def __exit__(self, *exc):
        pcg_gpu.stage_bytes, kernels.source, kernels.module = self._saved


def with_marks(name, text):
    """``marked`` applied to kernels/pcg.cu (a :class:`Variant` patch)."""
    return marked(text) if name == "pcg" else text


# --blocks: the classic kernel's product timed per warp (clock64 around it), each block's SM kept; and the
# product's work dealt with WorkItems' warps numbered backwards, so that the first warps take what the last
# took: slow blocks that move with the work are slow for their work, those that stay for their place.
PRODUCT = "pq[0] = stored_product(a.A, stage, p_new, a.q);"
PRODUCT_TIMED = ("const long long t0_ = clock64(); " + PRODUCT + " const long long t1_ = clock64(); "
                 "if ((threadIdx.x & 31) == 0) warp_cycles[(blockIdx.x * blockDim.x + threadIdx.x) >> 5] += t1_ - t0_; "
                 "if (threadIdx.x == 0) { unsigned int sm_; asm(\"mov.u32 %0, %%smid;\" : \"=r\"(sm_)); "
                 "block_sm[blockIdx.x] = sm_; }")
MAX_WARPS = 8192
WARP_NUMBER = "warp((blockIdx.x * blockDim.x + threadIdx.x) >> 5)"
WARP_NUMBER_BACKWARDS = "warp(((gridDim.x * blockDim.x) >> 5) - 1 - ((blockIdx.x * blockDim.x + threadIdx.x) >> 5))"


def product_timed(backwards):
    """A :class:`Variant` patch: the product's clock marks in pcg.cu; SELL's warps numbered backwards if asked."""
    def patch(name, text):
        if name == "pcg":
            if text.count(PRODUCT) != 1:
                raise RuntimeError("kernels/pcg.cu's stored product moved: the probe's marks need updating")
            return (f"__device__ unsigned long long warp_cycles[{MAX_WARPS}]; __device__ int block_sm[{MAX_WARPS}];\n"
                    + text.replace(PRODUCT, PRODUCT_TIMED))
        if name == "sell" and backwards:
            if WARP_NUMBER not in text:
                raise RuntimeError("kernels/sell.cu's WorkItems moved: the probe's patch needs updating")
            return text.replace(WARP_NUMBER, WARP_NUMBER_BACKWARDS)
        return text
    return patch


def product_by_block(A, b, say):
    """``--blocks``: the classic kernel's product (stored gather), us a warp an iteration, by block, with the
    work dealt as it is and backwards."""
    import cupy
    say("| warps numbered | us/it (marked) | warp mean | block's slowest warp: mean, max | slowest blocks (SM): us |")
    say("|---|---|---|---|---|")
    for backwards in (False, True):
        with Variant(False, product_timed(backwards)) as v:
            g = pcg_gpu.GPUPCG(A, "jacobi", np.float64, "while", 32, False, "classic", gather="stored", renumber=True)
        warps = g.grid * g.run_block // 32
        if warps > MAX_WARPS:
            raise RuntimeError(f"{warps} warps, more than the probe's {MAX_WARPS}")
        bd = g.check_vector(b, "b")
        g.solve(bd, None, 0.0, ITERATIONS, None, False)  # captures the graph
        cycles = cupy.ndarray((MAX_WARPS,), cupy.uint64, memptr=v.module.get_global("warp_cycles"))
        cycles[...] = 0
        iterations = g.solve(bd, None, 0.0, ITERATIONS, None, False)[2]
        seconds = g.last_loop_time / max(iterations, 1)
        clock = cupy.cuda.Device().attributes["ClockRate"] * 1e3
        warp_us = cycles[:warps].get().astype(np.float64) / max(iterations, 1) / clock * 1e6
        sms = cupy.ndarray((MAX_WARPS,), cupy.int32, memptr=v.module.get_global("block_sm"))[:g.grid].get()
        block_us = warp_us.reshape(g.grid, -1).max(axis=1)
        slowest = np.argsort(-block_us)[:6]
        cells = ", ".join(f"{k} ({sms[k]}): {block_us[k]:.1f}" for k in slowest)
        say(f"| {'backwards' if backwards else 'as dealt'} | {seconds * 1e6:.2f} | {warp_us.mean():.1f} | "
            f"{block_us.mean():.1f}, {block_us.max():.1f} | {cells} |")


def solver(A):
    """The solver as ``PCG`` sets it up (SELL's own numbering where its layout takes one)."""
    return pcg_gpu.GPUPCG(A, "jacobi", np.float64, "while", 32, False, renumber=True)


def phases(A, b, staged, say):
    """The phases of ``auto``'s variant: cycles a warp an iteration, mean over warps."""
    import cupy
    with Variant(staged, with_marks) as v:
        g = solver(A)
    bd = g.check_vector(b, "b")
    g.solve(bd, None, 0.0, ITERATIONS, None, False)
    counter = cupy.ndarray((8,), cupy.uint64, memptr=v.module.get_global("phase_cycles"))
    counter[...] = 0
    iterations = g.solve(bd, None, 0.0, ITERATIONS, None, False)[2]
    if staged and not g.stage_bytes:
        return PHASES[g.variant]  # too large to stage: the same kernel as loaded
    cycles = counter.get().astype(np.float64) / (g.grid * g.run_block // 32) / max(iterations, 1)
    clock = cupy.cuda.Device().attributes["ClockRate"] * 1e3
    names = PHASES[g.variant]
    total = cycles[:len(names)].sum()
    cells = " | ".join(f"{c / clock * 1e6:.2f} ({c / total:.0%})" for c in cycles[:len(names)])
    say(f"| {g.variant}, {'staged' if g.stage_bytes else 'as loaded'} | {total / clock * 1e6:.2f} | {cells} |")
    return names


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="matrix names to run (substring match)")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), help="variants to time (names of VARIANTS)")
    ap.add_argument("--blocks", action="store_true",
                    help="the classic product's time by block, dealt as is and backwards")
    ap.add_argument("--ncu", action="store_true", help="one eager solve of each matrix, for ncu")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    gpu, stamp, lines, say = results_log()
    commit = provenance.commit()
    chosen = [(label, make) for label, make in MATRICES if not args.only or any(o in label for o in args.only)]
    if args.ncu:
        for label, make in chosen:
            A = make()
            g = pcg_gpu.GPUPCG(A, "jacobi", np.float64, "eager", 32, False, renumber=True)
            print(f"# {label}: {g.variant}, {g.describe()}, {g.grid} x {g.run_block}", flush=True)
            g.solve(g.check_vector(A @ np.ones(A.shape[0]), "b"), None, 0.0, 96, None, False)
        return 0
    say(f"# PCG iteration phases and variants, {stamp} UTC, {gpu}, commit {commit}")
    say()
    say(f"python scripts/probe_pcg_phases.py {' '.join(argv if argv is not None else sys.argv[1:])}: "
        f"{ITERATIONS} iterations in while mode (32 a launch), Jacobi, float64, fastest of 3 solves.")
    for label, make in chosen:
        A = make()
        b = A @ np.ones(A.shape[0])
        say()
        say(f"## {label} (n {A.shape[0]:,}, nnz {A.nnz:,})")
        say()
        say("| variant | PCG | us/it | iterations | grid | layout |")
        say("|---|---|---|---|---|---|")
        for name in args.variants:
            with Variant(VARIANTS[name]):
                g = solver(A)
            t, its = timed_solves(g, b)
            say(f"| {name} | {g.variant} | {t * 1e6:.2f} | {its} | {g.grid} x {g.run_block} | {g.describe()} |")
            provenance.save(args.out, f"probe_pcg_phases_{stamp}_{gpu.replace(' ', '_')}_{commit}.md",
                            "\n".join(lines) + "\n")
        say()
        if args.blocks:
            say("The classic product by block, us a warp an iteration at the SM clock, clock marks compiled in:")
            say()
            product_by_block(A, b, say)
            provenance.save(args.out, f"probe_pcg_blocks_{stamp}_{gpu.replace(' ', '_')}_{commit}.md",
                            "\n".join(lines) + "\n")
            continue
        say("Phases, us a warp an iteration at the SM clock (share), clock marks compiled in:")
        say()
        rows = []
        names = [phases(A, b, staged, rows.append) for staged in (False, True)][0]
        say(f"| kernel | total | {' | '.join(names)} |")
        say("|" + "---|" * (len(names) + 2))
        for row in rows:
            say(row)
        provenance.save(args.out, f"probe_pcg_phases_{stamp}_{gpu.replace(' ', '_')}_{commit}.md",
                        "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
