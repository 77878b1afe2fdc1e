"""Where a distributed MD step's time goes: a plain step's phases and a list build's, per rank count.

Run under MPI on a multi-GPU machine, one rank per GPU::

    mpirun -n 2 python scripts/probe_dist_md.py --sizes 32000 1048576 4194304

Rank 0 prints, per size: the throughput of ``Simulation.run`` (us a step, list
builds); a plain step taken alone (synchronised) split into its phases by timing
events on the main stream, and the host's time to enqueue a step; and the
agreed list builds met on the way, split into the phases named by
``--phases`` (methods of the backend, each timed between two synchronisations,
so nested phases are counted inside their callers too).
"""
import argparse
import collections
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_dist_md import DENSITY, DT, RC, SEED, SKIN, TEMP, lattice_for  # noqa: E402
from solvers.distributed.comm import abort_on_error, world  # noqa: E402
from solvers.md import LennardJones, Simulation, VelocityVerlet, lattice_state  # noqa: E402
from solvers.kernels.md_params import C_STATUS, C_STEP, C_TARGET, ST_REBUILD, ST_RUNNING  # noqa: E402

# (Not the list kernels' launches: those are captured into the step's graph too, where no synchronisation may be.)
PHASES = ("_rebuild", "_migrate", "_lay_out", "_plan_ghosts", "_allocate_lists", "_build_lists", "_capture_step")


def time_phases(backend, names):
    """Wrap the backend's methods ``names`` (those it has) to add their synchronised seconds to a dict."""
    spent = collections.defaultdict(float)
    calls = collections.Counter()
    for name in names:
        method = getattr(backend, name, None)
        if method is None:
            continue

        def timed(*args, _method=method, _name=name, **kwargs):
            backend.stream.synchronize()
            t0 = time.perf_counter()
            out = _method(*args, **kwargs)
            backend.stream.synchronize()
            spent[_name] += time.perf_counter() - t0
            calls[_name] += 1
            return out

        setattr(backend, name, timed)
    return spent, calls


def single_steps(backend, count, cp):
    """``count`` steps one at a time: (per-phase GPU us lists, host enqueue us list, rebuild count)."""
    driver, steps = backend.driver, backend.iteration
    phases, host, rebuilds = [], [], 0
    with backend.stream:
        backend.ctl[C_TARGET] = backend.step + 10 ** 9
        backend.ctl[C_STATUS] = ST_RUNNING
        for _ in range(count):
            steps = backend.iteration
            events = driver.timing_events(steps)
            backend.stream.synchronize()
            t0 = time.perf_counter()
            used = driver.enqueue(steps, events)
            host.append((time.perf_counter() - t0) * 1e6)
            backend.stream.synchronize()
            phases.append([cp.cuda.get_elapsed_time(events[k], events[k + 1]) * 1e3 for k in range(used - 1)])
            if int(backend.ctl[C_STATUS].get()) == ST_REBUILD:
                backend._rebuild(backend.ctl.get())
                rebuilds += 1
        backend.step = int(backend.ctl[C_STEP].get())
    return phases, host, rebuilds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[32000])
    ap.add_argument("--steps", type=int, default=200, help="steps timed one at a time")
    ap.add_argument("--run-steps", type=int, default=300, help="steps of the throughput run")
    ap.add_argument("--phases", nargs="+", default=list(PHASES))
    args = ap.parse_args(argv)
    import cupy as cp
    comm = world()
    say = print if comm.Get_rank() == 0 else (lambda *a, **k: None)
    with abort_on_error(comm):
        for n in args.sizes:
            state = lattice_state(DENSITY, lattice_for(n), TEMP, SEED)
            sim = Simulation(state, LennardJones(rc=RC), VelocityVerlet(DT), skin=SKIN, device="gpu",
                             precision="mixed", comm=comm)
            b = sim._backend
            sim.run(100)
            builds0 = sim.neighbor_builds
            seconds = sim.run(args.run_steps)
            builds = sim.neighbor_builds - builds0
            say(f"N {state.n:,} ranks {comm.Get_size()} grid {sim.rank_grid}: run {seconds / args.run_steps * 1e6:.1f}"
                f" us/step, {builds} builds in {args.run_steps} steps; own {b.n:,} ghosts "
                f"{getattr(b, 'ghosts', 0):,}", flush=True)
            spent, calls = time_phases(b, args.phases)
            phases, host, rebuilds = single_steps(b, args.steps, cp)
            width = min(len(p) for p in phases)
            med = np.median([p[:width] for p in phases], axis=0)
            say("  single step (synchronised), median us per interval (local work and communication in turn): "
                + " ".join(f"{v:.1f}" for v in med) + f"; sum {med.sum():.1f}; host enqueue median "
                f"{np.median(host):.1f} us", flush=True)
            say(f"  {rebuilds} list builds in {args.steps} steps, ms per build (synchronised, nested): "
                + ", ".join(f"{k} {spent[k] / max(calls[k], 1) * 1e3:.2f} (x{calls[k] / max(rebuilds, 1):.0f})"
                            for k in args.phases if calls[k]), flush=True)
            del sim, b
            cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
