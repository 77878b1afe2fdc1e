"""Benchmark the MD drivers against OpenMM's CUDA platform on the same Lennard-Jones liquid.

The system is LAMMPS ``bench/in.lj`` scaled: fcc at density 0.8442, T 1.44,
rc 2.5 (unshifted), skin 0.3, dt 0.005, mass 1. Every engine starts from the
same state, is warmed up (graph capture, OpenMM context setup and kernel
compilation), then timed over a fixed number of steps ending in a read of the
energies (so queued GPU work is included). Prints a markdown table and saves it
as ``scripts/results/md_<date>_<time>_<gpu>.md``.

Usage: ``PYTHONPATH=. python3 scripts/bench_md.py [--sizes 4000 32000] [--seconds 1]``
"""
import argparse
import os
import platform
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import provenance  # noqa: E402
from solvers.md import LennardJones, Simulation, VelocityVerlet, lattice_state  # noqa: E402
from solvers import kernels  # noqa: E402

DENSITY, TEMP, SEED, RC, SKIN, DT = 0.8442, 1.44, 87287, 2.5, 0.3, 0.005


def cells_for(n):
    c = round((n / 4) ** (1 / 3))
    if 4 * c ** 3 != n:
        raise SystemExit(f"N = {n} is not 4 c^3 (an fcc box of c^3 cells)")
    return c


def time_graphsolve(state, mode, precision, seconds, tpp=None, by_cell=False):
    sim = Simulation(state, LennardJones(rc=RC), VelocityVerlet(DT), skin=SKIN, device="gpu", mode=mode,
                     precision=precision, threads_per_particle=tpp, cell_order=by_cell)
    sim.run(100)  # includes the capture
    rate = 100 / sim.run(100)
    steps = int(min(max(rate * seconds, 100), 20000))
    elapsed = sim.run(steps)  # one chunk: one launch in while mode
    return steps / elapsed, steps, sim.thermo["TotEng"]


def time_openmm(state, precision, seconds):
    import openmm
    from openmm import unit

    system = openmm.System()
    nb = openmm.NonbondedForce()
    nb.setNonbondedMethod(openmm.NonbondedForce.CutoffPeriodic)
    nb.setCutoffDistance(RC)
    nb.setUseDispersionCorrection(False)
    nb.setUseSwitchingFunction(False)
    for _ in range(state.n):
        system.addParticle(1.0)
        nb.addParticle(0.0, 1.0, 1.0)
    system.addForce(nb)
    lx, ly, lz = state.box
    system.setDefaultPeriodicBoxVectors(openmm.Vec3(lx, 0, 0), openmm.Vec3(0, ly, 0), openmm.Vec3(0, 0, lz))
    integ = openmm.VerletIntegrator(DT)
    plat = openmm.Platform.getPlatformByName("CUDA")
    ctx = openmm.Context(system, integ, plat, {"Precision": precision})
    ctx.setPositions(unit.Quantity(state.positions, unit.nanometer))
    ctx.setVelocities(unit.Quantity(state.velocities, unit.nanometer / unit.picosecond))
    integ.step(100)  # includes kernel compilation
    ctx.getState(getEnergy=True)
    t0 = time.perf_counter()
    integ.step(100)
    ctx.getState(getEnergy=True)
    rate = 100 / (time.perf_counter() - t0)
    steps = int(min(max(rate * seconds, 100), 20000))
    t0 = time.perf_counter()
    integ.step(steps)
    st = ctx.getState(getEnergy=True)
    elapsed = time.perf_counter() - t0
    e = (st.getPotentialEnergy() + st.getKineticEnergy()).value_in_unit(unit.kilojoule_per_mole) / state.n
    return steps / elapsed, steps, e


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[4000, 32000, 256000, 1048576])
    p.add_argument("--modes", nargs="+", default=["while", "graph", "eager"])
    p.add_argument("--precisions", nargs="+", default=["mixed", "double"])
    p.add_argument("--openmm-precisions", nargs="*", default=["single", "mixed"],
                   help="OpenMM CUDA precisions to time (none: skip OpenMM)")
    p.add_argument("--seconds", type=float, default=1.0, help="target time per measurement")
    p.add_argument("--tpp", type=int, help="graphsolve lanes per particle (default: chosen from N)")
    p.add_argument("--sweep", action="store_true",
                   help="also time while/mixed with half and twice the default lanes per particle, "
                        "and with the list built in cell order")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)

    import cupy
    gpu = kernels.device_name()
    try:
        import openmm
        omm_version = openmm.version.full_version
    except ImportError:
        openmm, omm_version = None, None
    rows = []
    for n in args.sizes:
        c = cells_for(n)
        state = lattice_state(DENSITY, (c, c, c), TEMP, SEED)
        results = []
        for precision in args.precisions:
            for mode in args.modes:
                if precision == "double" and mode != "while":
                    continue  # double is measured in the fastest driver only
                sps, steps, e = time_graphsolve(state, mode, precision, args.seconds, args.tpp)
                results.append((f"graphsolve {mode}", precision, sps, steps, e))
                print(f"N={n} graphsolve {mode} {precision}: {sps:.1f} steps/s", flush=True)
        if args.sweep:
            from solvers.md.gpu import threads_per_particle
            base = threads_per_particle(n)
            for tpp in sorted({max(base // 2, 1), base, min(base * 2, 32)}):
                for by_cell in (False, True):
                    sps, steps, e = time_graphsolve(state, "while", "mixed", args.seconds, tpp, by_cell)
                    name = f"graphsolve while, tpp {tpp}{', list in cell order' if by_cell else ''}"
                    results.append((name, "mixed", sps, steps, e))
                    print(f"N={n} {name}: {sps:.1f} steps/s", flush=True)
        omm = {}
        if openmm is not None:
            for precision in args.openmm_precisions:
                sps, steps, e = time_openmm(state, precision, args.seconds)
                omm[precision] = sps
                results.append((f"OpenMM {omm_version} CUDA", precision, sps, steps, e))
                print(f"N={n} OpenMM {precision}: {sps:.1f} steps/s", flush=True)
        best = max(omm.values()) if omm else None
        for name, precision, sps, steps, e in results:
            ratio = f"{sps / best:.2f}" if best else "n/a"
            rows.append(f"| {n:,} | {name} | {precision} | {sps:,.0f} | {sps * n:.3e} | {ratio} | {steps} | {e:.6f} |")

    stamp = provenance.stamp()
    lines = [
        f"# MD benchmark, {stamp} UTC, {gpu}, commit {provenance.commit()}",
        "",
        f"LJ fcc liquid, density {DENSITY}, T0 {TEMP}, rc {RC} (unshifted), skin {SKIN}, dt {DT}, NVE; "
        f"graphsolve rebuilds the list when a particle moved > skin/2 (checked every step, on the device). "
        f"OpenMM {omm_version or '(not installed)'}, NonbondedForce CutoffPeriodic, no dispersion correction, "
        f"VerletIntegrator. Host: Python {platform.python_version()}, CuPy {cupy.__version__}, "
        f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}, driver {cupy.cuda.runtime.driverGetVersion()}.",
        "",
        "ratio = steps/s over the best OpenMM precision at that N; TotEng/atom is printed as a sanity check "
        "(it differs between engines only through the lattice melt after different step counts).",
        "",
        "| N | engine | precision | steps/s | atom-steps/s | vs OpenMM | timed steps | TotEng/atom |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-")
    path = provenance.save(args.out, f"md_{stamp}_{slug}.md", text)
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
