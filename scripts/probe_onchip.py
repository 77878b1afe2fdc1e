"""Where an on-chip PCG iteration's time goes: layouts side by side, and the cost of its parts.

Run on a GPU machine::

    python scripts/probe_onchip.py layouts [--iterations 300]
    python scripts/probe_onchip.py costs [--iterations 300]

``layouts`` times each small matrix at several on-chip layouts (block threads,
rows a thread, blocks a cluster), the layout forced in place of
:func:`solvers.pcg.onchip.latency_shape`. ``costs`` times the kernel as it is
against two altered copies made here (never shipped): without the per-iteration
record of the State and progress word, and with the iteration's second reduction
done twice (the same result, one reduction more): the differences are what those
parts cost. Every figure: float64, Jacobi, while mode, the whole solve one launch,
rtol 0 and a fixed number of iterations, best of three, us per iteration.
"""
import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import solvers  # noqa: E402
import solvers.kernels as kernels  # noqa: E402
import solvers.pcg.onchip as onchip  # noqa: E402
from solvers.gallery import poisson  # noqa: E402
from solvers.mmio import read_matrix  # noqa: E402

DATA = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "matrices"
LAYOUTS = {  # (block threads, rows a thread, blocks a cluster)
    "gr_900_900_crg": [(512, 2, 1), (256, 4, 1), (928, 1, 1), (320, 3, 1), (512, 1, 2)],
    "1138_bus": [(384, 3, 1), (576, 2, 1), (288, 4, 1), (576, 1, 2)],
    "2D Poisson 64^2": [(512, 1, 8), (512, 2, 4), (256, 2, 8), (1024, 1, 4), (512, 4, 2)],
    "lap2D_5pt_n100": [(512, 2, 10), (1024, 1, 10), (640, 1, 16)],
    "2D Poisson 128^2": [(512, 2, 16), (1024, 1, 16), (256, 4, 16)],
    "2D Poisson 256^2": [(512, 8, 16), (1024, 4, 16)],
}
RECORD = "            if (recorder) record_decision(st, it, rnorm, status, a.history, a.progress, handle);"
SECOND = "            team_sums(sums, sc, round);\n            ++it;"
ALTERED = {
    "as it is": lambda text: text,
    "without the per-iteration record": lambda text: text.replace(
        RECORD, RECORD.replace("(recorder)", "(recorder && status != RUNNING)")),
    "second reduction twice": lambda text: text.replace(
        SECOND, "            { double again[2] = {sums[0], sums[1]}; team_sums(again, sc, round); }\n" + SECOND),
}


def matrix(name):
    if name.startswith("2D Poisson"):
        side = int(name.split()[-1].split("^")[0])
        return poisson((side, side))
    return read_matrix(str(DATA / f"{name}.mtx"))


def per_iteration(A, iterations):
    """The on-chip layout's description and the best us per iteration of three solves."""
    b = np.random.default_rng(0).standard_normal(A.shape[0])
    solver = solvers.PCG(A, device="gpu", mode="while", path="on-chip", unroll=iterations + 1, rtol=0.0,
                         maxiter=iterations, reorder="none")
    solver.solve(b)  # warm-up: compile and capture
    return solver.format, min(solver.solve(b).loop_time for _ in range(3)) / iterations * 1e6


def layouts(iterations):
    for name, shapes in LAYOUTS.items():
        A = matrix(name)
        for shape in shapes:
            onchip.latency_shape = lambda rows, s=shape: onchip.Shape(*s)
            try:
                layout, us = per_iteration(A, iterations)
                print(f"| {name} | {shape} | {layout} | {us:.2f} |", flush=True)
            except solvers.InputError as exc:
                print(f"| {name} | {shape} | refused: {exc} | |", flush=True)


def costs(iterations):
    source = kernels.source
    text = source("onchip")
    for label, alter in ALTERED.items():
        altered = alter(text)
        if label != "as it is" and altered == text:
            raise SystemExit(f"probe_onchip: the kernel no longer has the code {label!r} alters")
        kernels.source = lambda name, t=altered: t if name == "onchip" else source(name)
        for name in ("gr_900_900_crg", "2D Poisson 64^2", "2D Poisson 128^2"):
            layout, us = per_iteration(matrix(name), iterations)
            print(f"| {label} | {name} | {layout} | {us:.2f} |", flush=True)
    kernels.source = source


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("layouts", "costs"))
    ap.add_argument("--iterations", type=int, default=300)
    args = ap.parse_args(argv)
    (layouts if args.what == "layouts" else costs)(args.iterations)
    return 0


if __name__ == "__main__":
    sys.exit(main())
