"""Command line: ``python -m solvers.md`` runs pair-potential MD with LAMMPS-style output.

Under an MPI launcher (``mpiexec -n N``, ``srun``) the same command runs one
simulation over the N ranks (spatial decomposition); rank 0 prints the log and
writes the files.

Exit codes: 0 finished, 1 the run blew up (non-finite values), 2 bad input or unusable device,
130/143 stopped by SIGINT/SIGTERM (files complete or as they were).
"""
import argparse
import sys

from ..cli_common import add_version_option, check_finite
from ..distributed.launch import several_ranks
from ..errors import DeviceError, InputError
from ..interrupts import exits_cleanly
from ..outfiles import check_target
from .cpu import CPU_MODES
from .forcefield import LennardJones, Morse
from .integrators import Langevin, VelocityVerlet
from .io import DumpWriter, check_restart_target
from .simulation import PRECISIONS, STEPS_PER_CHECK, STEPS_PER_LAUNCH, Simulation
from .state import lattice_state, read_dump
from .thermo import UnstableRunError, format_row, header

EXIT_OK, EXIT_BLOWUP, EXIT_BAD_INPUT = 0, 1, 2
# Options a restart file fixes; giving them with --resume is an error, not silently ignored.
_FIXED_BY_RESTART = ("data", "lattice", "density", "cells", "temp", "seed", "dt", "rc", "skin", "shift", "pair",
                     "epsilon", "sigma", "morse", "thermostat", "t_target", "damp", "precision")
DEFAULTS = {"lattice": "fcc", "density": 0.8442, "cells": (20, 20, 20), "temp": 1.44, "seed": 87287, "dt": 0.005,
            "rc": 2.5, "skin": 0.3, "pair": "lj", "epsilon": 1.0, "sigma": 1.0, "morse": (1.0, 6.0, 1.122462),
            "damp": 1.0}


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m solvers.md",
        description="Molecular dynamics of one particle type (Lennard-Jones or Morse; NVE or Langevin) in a "
                    "periodic box; on a GPU each chunk of timesteps between outputs is one CUDA graph launch. "
                    "Under mpiexec or srun, one simulation is spread over the ranks. Output follows LAMMPS's "
                    "log format. Physics options left out take the defaults shown; with --resume they come "
                    "from the restart file and giving them is an error.")
    add_version_option(p)
    src = p.add_argument_group("system (default: an fcc lattice like LAMMPS bench/in.lj)")
    src.add_argument("--data", help="start from a LAMMPS text dump with id x y z [vx vy vz] (gzip allowed); "
                                    "the box comes from its BOX BOUNDS")
    src.add_argument("--resume", help="continue exactly from a restart file written by --restart")
    src.add_argument("--lattice", choices=("fcc",), help="lattice to start from (default fcc)")
    src.add_argument("--density", type=float, help="lattice number density (default 0.8442)")
    src.add_argument("--cells", type=int, nargs=3, metavar=("NX", "NY", "NZ"),
                     help="lattice unit cells (default 20 20 20: 32,000 atoms)")
    src.add_argument("--temp", type=float, help="initial temperature of a lattice (default 1.44)")
    src.add_argument("--seed", type=int, help="seed of the lattice velocities and of the Langevin noise "
                                              "(default 87287)")
    phys = p.add_argument_group("physics")
    phys.add_argument("--steps", type=int, default=100, help="timesteps to run (default 100)")
    phys.add_argument("--dt", type=float, help="timestep in lj time units (default 0.005)")
    phys.add_argument("--pair", choices=("lj", "morse"),
                      help="pair potential: lj (LAMMPS lj/cut) or morse (LAMMPS morse) (default lj)")
    phys.add_argument("--epsilon", type=float, help="LJ well depth (default 1)")
    phys.add_argument("--sigma", type=float, help="LJ size (default 1)")
    phys.add_argument("--morse", type=float, nargs=3, metavar=("D0", "ALPHA", "R0"),
                      help="Morse well depth, stiffness and minimum distance (default 1 6 1.122462)")
    phys.add_argument("--rc", type=float, help="pair cutoff (default 2.5)")
    phys.add_argument("--skin", type=float, help="neighbour-list skin; the list is rebuilt once a particle has "
                                                 "moved more than skin/2 (default 0.3)")
    phys.add_argument("--shift", action="store_true", default=None, help="shift the pair energy to 0 at rc")
    phys.add_argument("--thermostat", choices=("none", "langevin"),
                      help="none: NVE (velocity Verlet); langevin: NVT, LAMMPS fix langevin (default none)")
    phys.add_argument("--t-target", type=float, help="Langevin target temperature (default --temp)")
    phys.add_argument("--damp", type=float, help="Langevin damping time (default 1.0)")
    out = p.add_argument_group("output")
    out.add_argument("--thermo", type=int, default=0, help="thermo output every N steps (default 0: first and last)")
    out.add_argument("--log", help="also write the LAMMPS-style log to this file (LAMMPS log readers parse it)")
    out.add_argument("--dump", help="trajectory: .xyz/.extxyz (extended XYZ, as ASE and OVITO read it) or any "
                                    "other name (LAMMPS text dump); .gz compresses")
    out.add_argument("--dump-every", type=int, default=100,
                     help="steps between trajectory frames (default 100; the first step is always written)")
    out.add_argument("--species", default="Ar",
                     help="element name of the particles in extended XYZ files (default Ar: reduced LJ units "
                          "name no element; argon is the conventional one)")
    out.add_argument("--restart", help="write a restart file (.npz) at the end")
    run = p.add_argument_group("execution")
    run.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                     help="auto: the GPU when CuPy and a CUDA device are usable, else the CPU (default auto)")
    run.add_argument("--mode", choices=("auto", "eager", "graph", "while") + CPU_MODES, default="auto",
                     help="single-GPU driver: eager launches, a relaunched graph, or a WHILE node "
                          "(auto: while where CUDA >= 12.4); CPU kernels: numpy (the reference) or numba "
                          "(compiled, needs Numba; auto: numba where installed) (default auto)")
    run.add_argument("--precision", choices=PRECISIONS,
                     help="double, or mixed (float32 state, float64 sums) (default: mixed on the GPU, double on "
                          "the CPU)")
    run.add_argument("--unroll", type=int,
                     help=f"one GPU: steps per kernel launch (per graph launch or WHILE pass; default "
                          f"{STEPS_PER_LAUNCH}); GPU ranks: steps enqueued between two reads of the device status "
                          f"(default {STEPS_PER_CHECK})")
    return p


class _Log:
    """The LAMMPS-style log: standard output and, with --log, a file; on rank 0 only."""

    def __init__(self, path, root):
        self.root = root
        self._file = None
        if path and root:
            try:
                self._file = open(path, "w", encoding="utf-8")
            except OSError as exc:
                raise InputError(f"cannot write log ({exc.strerror})", path) from None

    def __call__(self, line=""):
        if not self.root:
            return
        print(line, flush=True)
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self):
        if self._file is not None:
            self._file.close()


def _option(args, name):
    value = getattr(args, name)
    return DEFAULTS[name] if value is None else value


def _potential(args):
    rc, shift = _option(args, "rc"), bool(args.shift)
    if _option(args, "pair") == "morse":
        if args.epsilon is not None or args.sigma is not None:
            raise InputError("--epsilon and --sigma are Lennard-Jones parameters; Morse takes --morse", "--pair")
        d0, alpha, r0 = _option(args, "morse")
        return Morse(d0, alpha, r0, rc, shift)
    if args.morse is not None:
        raise InputError("--morse needs --pair morse", "--morse")
    return LennardJones(_option(args, "epsilon"), _option(args, "sigma"), rc, shift)


def _check_counts(args):
    for name, value in (("--steps", args.steps), ("--thermo", args.thermo), ("--dump-every", args.dump_every)):
        if value < 0:
            raise InputError(f"must be >= 0, got {value}", name)
    if args.unroll is not None and args.unroll < 1:
        raise InputError(f"must be >= 1, got {args.unroll}", "--unroll")


def _check_values(args, root):
    """Refuse non-finite numbers, an impossible seed and (on the writing rank) unwritable outputs."""
    check_finite(args, ("density", "temp", "dt", "rc", "skin", "epsilon", "sigma", "morse", "t_target", "damp"))
    if args.seed is not None and not 0 <= args.seed < 2 ** 64:
        raise InputError(f"must be in [0, 2**64), got {args.seed}", "--seed")
    if root and args.dump:
        check_target(args.dump, "dump")
    if root and args.restart:
        check_restart_target(args.restart)


def _simulation(args, comm=None):
    _check_counts(args)
    if comm is not None and args.mode not in ("auto",) + CPU_MODES:
        raise InputError("applies to single-process runs; over ranks a step is graph segments with the "
                         "communication between them", "--mode")
    if args.resume:
        given = [n for n in _FIXED_BY_RESTART if getattr(args, n) is not None]
        if given:
            raise InputError(f"--{given[0].replace('_', '-')} cannot be combined with --resume "
                             f"(the restart file fixes it)", args.resume)
        return Simulation.from_restart(args.resume, device=args.device, mode=args.mode, unroll=args.unroll,
                                       comm=comm)
    if args.data:
        for name in ("lattice", "density", "cells"):
            if getattr(args, name) is not None:
                raise InputError(f"--{name} describes a lattice; --data gives the system", args.data)
        state, source = read_dump(args.data), args.data
    else:
        state = lattice_state(_option(args, "density"), _option(args, "cells"), _option(args, "temp"),
                              _option(args, "seed"))
        source = "--lattice"
    ff = _potential(args)
    dt = _option(args, "dt")
    if (args.thermostat or "none") == "langevin":
        integ = Langevin(dt, _option(args, "temp") if args.t_target is None else args.t_target,
                         _option(args, "damp"), _option(args, "seed"))
    else:
        for name in ("t_target", "damp"):
            if getattr(args, name) is not None:
                raise InputError("applies to --thermostat langevin only", f"--{name.replace('_', '-')}")
        integ = VelocityVerlet(dt)
    return Simulation(state, ff, integ, skin=_option(args, "skin"), device=args.device, mode=args.mode,
                      precision=args.precision, unroll=args.unroll, source=source, comm=comm)


def memory_line(megabytes):
    """LAMMPS's memory line, which log readers take as the start of a thermo block."""
    lo, avg, hi = min(megabytes), sum(megabytes) / len(megabytes), max(megabytes)
    return f"Per MPI rank memory allocation (min/avg/max) = {lo:.4g} | {avg:.4g} | {hi:.4g} Mbytes"


def run(args, comm=None):
    """Set up, run and report; returns this process's exit code. Errors propagate to the caller.

    ``comm``: the MPI communicator of a distributed run (every rank calls this), or None.
    """
    root = comm is None or comm.Get_rank() == 0
    opened = {}

    def setup():
        _check_values(args, root)
        opened["log"] = _Log(args.log, root)
        opened["sim"] = _simulation(args, comm)
        if args.dump and root:
            opened["dump"] = DumpWriter(args.dump, species=args.species)

    try:
        if comm is None:
            setup()
        else:
            from ..distributed.comm import agree
            agree(comm, setup)
        log, sim, dump = opened["log"], opened["sim"], opened.get("dump")
        if sim.device_note:
            log(f"note: {sim.device_note}")
        n, ranks = sim.state.n, sim.ranks
        where = f", {ranks} ranks (grid {' x '.join(map(str, sim.rank_grid))})" if ranks > 1 else ""
        log(f"graphsolve md: {n} atoms, box {' '.join(f'{b:.10g}' for b in sim.state.box)}, "
            f"{sim.forcefield.name} pair, device {sim.device} (mode {sim.mode}, precision {sim.precision}){where}")
        log(memory_line(sim.memory_mb()))
        log(header())
        elapsed = sim.run(args.steps, thermo_every=args.thermo, dump=dump, dump_every=args.dump_every,
                          on_thermo=lambda row: log(format_row(row)))
        rate = args.steps / elapsed if elapsed > 0 else float("inf")
        log(f"Loop time of {elapsed:.6g} on {ranks} procs for {args.steps} steps with {n} atoms")
        log()
        log(f"Performance: {rate:.6g} timesteps/s, {rate * n:.6g} atom-step/s")
        log(f"Neighbor list builds = {sim.neighbor_builds}")
        log("Dangerous builds = 0")
        if args.restart:
            sim.write_restart(args.restart)
    finally:
        for name in ("dump", "log"):
            if name in opened:
                opened[name].close()
    return EXIT_OK


@exits_cleanly(held=several_ranks)  # a rank holds signals until it can end the whole job
def main(argv=None):
    """Run the CLI; returns the exit code."""
    args = build_parser().parse_args(argv)
    if several_ranks():
        from .parallel import run_distributed
        return run_distributed(args, run)
    try:
        return run(args)
    except (InputError, DeviceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except UnstableRunError as exc:
        print(f"error: run stopped: {exc}", file=sys.stderr)
        return EXIT_BLOWUP


if __name__ == "__main__":
    sys.exit(main())
