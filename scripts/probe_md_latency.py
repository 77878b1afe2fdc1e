"""Latency probe for the MD while driver: time per step over lanes per particle, skin and unroll.

Run on a GPU machine: ``python scripts/probe_md_latency.py``. Prints one line per
setting (N, tpp, skin, unroll, us per step, list builds per 100 steps); a larger
skin means rarer rebuilds (and longer lists), which separates the cost of the
plain steps from that of the rebuilds. Used to choose defaults that
``scripts/bench_md.py`` then measures against OpenMM.
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from solvers.md import LennardJones, Simulation, VelocityVerlet, lattice_state  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4000])
    ap.add_argument("--tpp", type=int, nargs="+", default=[0], help="lanes per particle (0: the default)")
    ap.add_argument("--skin", type=float, nargs="+", default=[0.3])
    ap.add_argument("--unroll", type=int, nargs="+", default=[8])
    ap.add_argument("--steps", type=int, default=4000)
    args = ap.parse_args(argv)
    for n in args.sizes:
        cells = round((n / 4) ** (1 / 3))
        for tpp in args.tpp:
            for skin in args.skin:
                for unroll in args.unroll:
                    sim = Simulation(lattice_state(cells=(cells,) * 3),
                                     LennardJones(rc=2.5), VelocityVerlet(0.005), skin=skin, device="gpu",
                                     mode="while", threads_per_particle=tpp or None, unroll=unroll)
                    sim.run(500)
                    builds = sim.neighbor_builds
                    elapsed = sim.run(args.steps)
                    per100 = 100 * (sim.neighbor_builds - builds) / args.steps
                    print(f"N {4 * cells ** 3:8d} tpp {sim._backend.tpp:2d} skin {skin:.2f} unroll {unroll:3d} "
                          f"{elapsed / args.steps * 1e6:8.2f} us/step  {per100:5.1f} builds/100 steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
