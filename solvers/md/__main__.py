"""Command line: ``python -m solvers.md`` runs Lennard-Jones MD with LAMMPS-style output.

Exit codes: 0 finished, 1 the run blew up (non-finite values), 2 bad input or unusable device.
"""
import argparse
import sys

from ..cli_common import add_version_option
from ..errors import DeviceError, InputError
from .forcefield import LennardJones
from .integrators import Langevin, VelocityVerlet
from .io import DumpWriter
from .simulation import PRECISIONS, STEPS_PER_LAUNCH, Simulation
from .state import lattice_state, read_dump
from .thermo import UnstableRunError, format_row, header

EXIT_OK, EXIT_BLOWUP, EXIT_BAD_INPUT = 0, 1, 2
# Options a restart file fixes; giving them with --resume is an error, not silently ignored.
_FIXED_BY_RESTART = ("data", "dt", "rc", "skin", "shift", "thermostat", "t_target", "damp", "precision")


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m solvers.md",
        description="Lennard-Jones molecular dynamics (NVE or Langevin); on a GPU each chunk of "
                    "timesteps between outputs is one CUDA graph launch. Output follows LAMMPS's log format.")
    add_version_option(p)
    src = p.add_argument_group("system (default: an fcc lattice like LAMMPS bench/in.lj)")
    src.add_argument("--data", help="LAMMPS dump with id x y z [vx vy vz] (gzip allowed); box from the dump")
    src.add_argument("--resume", help="continue exactly from a restart file written by --restart")
    src.add_argument("--lattice", choices=("fcc",), default="fcc")
    src.add_argument("--density", type=float, default=0.8442, help="lattice number density (default 0.8442)")
    src.add_argument("--cells", type=int, nargs=3, default=(20, 20, 20), metavar=("NX", "NY", "NZ"),
                     help="lattice unit cells (default 20 20 20: 32,000 atoms)")
    src.add_argument("--temp", type=float, default=1.44, help="initial temperature of a lattice (default 1.44)")
    src.add_argument("--seed", type=int, default=87287, help="seed of lattice velocities and Langevin noise")
    phys = p.add_argument_group("physics")
    phys.add_argument("--steps", type=int, default=100)
    phys.add_argument("--dt", type=float, help="timestep (default 0.005)")
    phys.add_argument("--rc", type=float, help="LJ cutoff (default 2.5)")
    phys.add_argument("--skin", type=float, help="neighbour skin (default 0.3)")
    phys.add_argument("--shift", action="store_true", default=None, help="shift the LJ energy to 0 at rc")
    phys.add_argument("--thermostat", choices=("none", "langevin"))
    phys.add_argument("--t-target", type=float, help="Langevin target temperature (default --temp)")
    phys.add_argument("--damp", type=float, help="Langevin damping time (default 1.0)")
    out = p.add_argument_group("output")
    out.add_argument("--thermo", type=int, default=0, help="thermo output every N steps (0: first and last)")
    out.add_argument("--dump", help="trajectory: .xyz/.extxyz (extended XYZ) or anything else (LAMMPS dump)")
    out.add_argument("--dump-every", type=int, default=100)
    out.add_argument("--restart", help="write a restart file at the end")
    run = p.add_argument_group("execution")
    run.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    run.add_argument("--mode", choices=("auto", "eager", "graph", "while"), default="auto",
                     help="GPU driver (default: while where CUDA supports it)")
    run.add_argument("--precision", choices=PRECISIONS, help="default: mixed on the GPU, double on the CPU")
    run.add_argument("--unroll", type=int, default=STEPS_PER_LAUNCH, help="steps per kernel launch (per graph launch or WHILE pass)")
    return p


def _simulation(args):
    for name, value in (("--steps", args.steps), ("--thermo", args.thermo), ("--dump-every", args.dump_every)):
        if value < 0:
            raise InputError(f"must be >= 0, got {value}", name)
    if args.unroll < 1:
        raise InputError(f"must be >= 1, got {args.unroll}", "--unroll")
    if args.resume:
        given = [n for n in _FIXED_BY_RESTART if getattr(args, n) is not None]
        if given:
            raise InputError(f"--{given[0].replace('_', '-')} cannot be combined with --resume "
                             f"(the restart file fixes it)", args.resume)
        return Simulation.from_restart(args.resume, device=args.device, mode=args.mode, unroll=args.unroll)
    if args.data:
        state, source = read_dump(args.data), args.data
    else:
        state, source = lattice_state(args.density, args.cells, args.temp, args.seed), "--lattice"
    ff = LennardJones(rc=2.5 if args.rc is None else args.rc, shift=bool(args.shift))
    dt = 0.005 if args.dt is None else args.dt
    if (args.thermostat or "none") == "langevin":
        integ = Langevin(dt, args.temp if args.t_target is None else args.t_target,
                         1.0 if args.damp is None else args.damp, args.seed)
    else:
        integ = VelocityVerlet(dt)
    return Simulation(state, ff, integ, skin=0.3 if args.skin is None else args.skin, device=args.device,
                      mode=args.mode, precision=args.precision, unroll=args.unroll, source=source)


def main(argv=None):
    """Run the CLI; returns the exit code."""
    args = build_parser().parse_args(argv)
    dump = None
    try:
        sim = _simulation(args)
        if sim.device_note:
            print(f"note: {sim.device_note}", file=sys.stderr)
        n = sim.state.n
        print(f"graphsolve md: {n} atoms, box {' '.join(f'{b:.10g}' for b in sim.state.box)}, "
              f"device {sim.device} (mode {sim.mode}, precision {sim.precision})")
        dump = DumpWriter(args.dump) if args.dump else None
        print(header())
        elapsed = sim.run(args.steps, thermo_every=args.thermo, dump=dump, dump_every=args.dump_every,
                          on_thermo=lambda row: print(format_row(row), flush=True))
        rate = args.steps / elapsed if elapsed > 0 else float("inf")
        print(f"Loop time of {elapsed:.6g} on 1 procs for {args.steps} steps with {n} atoms\n")
        print(f"Performance: {rate:.6g} timesteps/s, {rate * n:.6g} atom-step/s")
        print(f"Neighbor list builds = {sim.neighbor_builds}")
        print("Dangerous builds = 0")
        if args.restart:
            sim.write_restart(args.restart)
    except (InputError, DeviceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except UnstableRunError as exc:
        print(f"error: run stopped: {exc}", file=sys.stderr)
        return EXIT_BLOWUP
    finally:
        if dump is not None:
            dump.close()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
