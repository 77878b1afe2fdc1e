"""MD over GPU ranks against one GPU: steps/s of the same LJ liquid, one process versus N ranks.

The system is LAMMPS ``bench/in.lj`` scaled (fcc, density 0.8442, T 1.44, rc 2.5,
skin 0.3, dt 0.005, NVE). For every GPU count one MPI job is started
(``mpiexec -n G``, or ``--mpiexec``); the 1-GPU job also times the single-process
path (``while`` mode, one graph launch per chunk). Each run is warmed up (capture,
NCCL set-up), then timed over steps ending in a thermo reduction. Prints a
markdown table (speed-up over the single-process path and the overhead per step
against it) and saves it under ``scripts/results/``.

    python scripts/bench_dist_md.py --gpus 1 2 --sizes 32000 1048576 4194304
    python scripts/bench_dist_md.py --gpus 1 2 --sizes 4000 --device cpu --precision double   # CPU ranks
"""
import argparse
import faulthandler
import json
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
import provenance  # noqa: E402

TAG = "BENCH "
DENSITY, TEMP, SEED, RC, SKIN, DT = 0.8442, 1.44, 87287, 2.5, 0.3, 0.005


def lattice_for(n):
    """fcc cells (c, c, c) with 4 c^3 = n, or the nearest box of unequal edges (4 a b c = n)."""
    c = round((n / 4) ** (1 / 3))
    if 4 * c ** 3 == n:
        return (c, c, c)
    for a in range(c + 3, 0, -1):
        for b in range(a, 0, -1):
            if (n // 4) % (a * b) == 0 and 4 * a * b * ((n // 4) // (a * b)) == n:
                return (a, b, (n // 4) // (a * b))
    raise SystemExit(f"N = {n} is not 4 a b c")


def timed(sim, seconds, comm):
    sim.run(100)  # capture, NCCL warm-up
    rate = 100 / sim.run(100)
    steps = int(min(max(rate * seconds, 200), 20000))
    if comm is not None:
        steps = comm.bcast(steps, root=0)  # every rank runs the same steps (each timed its own warm-up)
    return steps / sim.run(steps), steps


def worker(args):
    """One MPI job (or a plain process for G = 1): rank 0 prints JSON lines."""
    from solvers.distributed.comm import abort_on_error, world
    from solvers.md import LennardJones, Simulation, VelocityVerlet, lattice_state

    comm = world() if args.ranks > 1 else None
    rank = 0 if comm is None else comm.Get_rank()
    margin = None
    if comm is not None and args.device == "gpu":
        from solvers.md import parallel_gpu
        if args.margin_skins is not None:
            parallel_gpu.MARGIN_SKINS = args.margin_skins[0]  # a worker gets one value
        margin = parallel_gpu.MARGIN_SKINS

    def body():
        for n in args.sizes:
            # A run that hangs ends with every rank's Python stack on stderr instead of blocking the job.
            faulthandler.dump_traceback_later(args.hang_seconds, exit=True)
            state = lattice_state(DENSITY, lattice_for(n), TEMP, SEED)
            if comm is None:  # one GPU: the single-process path, the reference
                name = "single process"
                sim = Simulation(state, LennardJones(rc=RC), VelocityVerlet(DT), skin=SKIN, device=args.device,
                                 mode="while" if args.device == "gpu" else "auto", precision=args.precision)
            else:
                name = "ranks"
                sim = Simulation(state, LennardJones(rc=RC), VelocityVerlet(DT), skin=SKIN, device=args.device,
                                 precision=args.precision, unroll=args.check_every, comm=comm)
            sps, steps = timed(sim, args.seconds, comm)
            row = dict(n=state.n, gpus=args.ranks, path=name, steps_per_s=sps, steps=steps,
                       grid="x".join(map(str, sim.rank_grid)), builds=sim.neighbor_builds,
                       migrations=sim.migrations, margin_skins=margin,
                       toteng=sim.thermo["TotEng"], mode=sim.mode)
            if rank == 0:
                print(TAG + json.dumps(row), flush=True)
            del sim
            faulthandler.cancel_dump_traceback_later()

    if comm is None:
        body()
    else:
        with abort_on_error(comm):
            body()


def launch(args, gpus, out_lines, margin_skins=None):
    cmd = [sys.executable, __file__, "--worker", "--ranks", str(gpus), "--sizes", *map(str, args.sizes),
           "--seconds", str(args.seconds), "--device", args.device, "--precision", args.precision]
    if args.check_every:
        cmd += ["--check-every", str(args.check_every)]
    if margin_skins is not None:
        cmd += ["--margin-skins", str(margin_skins)]
    cmd += ["--hang-seconds", str(args.hang_seconds)]
    if gpus > 1:
        from solvers.distributed.launch import mpiexec_command
        cmd = [*(args.mpiexec.split() + ["-n", str(gpus)] if args.mpiexec else mpiexec_command(gpus)), *cmd]
    env = {**os.environ, "PYTHONPATH": str(REPO), "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0")}
    t0 = time.perf_counter()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        lines = []
        for line in proc.stdout:  # each row as it comes: a run cut short still shows the finished ones
            lines.append(line)
            if line.startswith(TAG):
                out_lines.append(json.loads(line[len(TAG):]))
                print(f"{gpus} GPU(s), {time.perf_counter() - t0:.1f} s: {line[len(TAG):].strip()}", file=sys.stderr,
                      flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{''.join(lines)[-6000:]}")


def table(rows, args):
    lines = ["| N | GPUs | path | rank grid | ghost margin (skins) | steps/s | us/step | speed-up vs 1 GPU | "
             "overhead vs 1 GPU (us/step) | list builds | of which with migration |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in args.sizes:
        at = [r for r in rows if r["n"] == n or abs(r["n"] - n) < 4]
        base = next((r for r in at if r["path"] == "single process"), None)
        for r in sorted(at, key=lambda r: (r["gpus"], r["path"] != "single process", r.get("margin_skins") or 0)):
            us = 1e6 / r["steps_per_s"]
            speed = f"{r['steps_per_s'] / base['steps_per_s']:.2f}x" if base else "n/a"
            over = f"{us - 1e6 / base['steps_per_s']:+.1f}" if base else "n/a"
            moved = r["migrations"] if r.get("migrations") is not None else "-"
            label = "one process (while)" if r["path"] == "single process" else f"{r['gpus']} rank(s)"
            margin = r["margin_skins"] if r.get("margin_skins") is not None else "-"
            lines.append(f"| {r['n']:,} | {r['gpus']} | {label} | {r['grid']} | {margin} | {r['steps_per_s']:,.0f} | "
                         f"{us:.1f} | "
                         f"{speed} | {over} | {r['builds']} | {moved} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="GPU counts (one MPI job each)")
    p.add_argument("--sizes", type=int, nargs="+", default=[32000, 1048576, 4194304], help="atoms")
    p.add_argument("--seconds", type=float, default=2.0, help="target time per measurement")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--precision", choices=("mixed", "double"), default="mixed")
    p.add_argument("--check-every", type=int, help="steps enqueued between status reads over ranks (default 4)")
    p.add_argument("--margin-skins", type=float, nargs="+",
                   help="GPU ranks' ghost margin in skins, one job per value (default: the library's)")
    p.add_argument("--hang-seconds", type=float, default=300,
                   help="a size whose runs take longer ends the job with each rank's stack")
    p.add_argument("--mpiexec", help="launcher prefix instead of mpiexec (e.g. 'mpirun --allow-run-as-root')")
    p.add_argument("--out", default=str(REPO / "scripts" / "results"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ranks", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.margin_skins and args.device != "gpu":
        p.error("--margin-skins: the CPU ranks choose ghosts at every list build (no margin)")
    if args.worker:
        worker(args)
        return 0
    rows = []
    for gpus in args.gpus:
        for margin in (args.margin_skins if gpus > 1 and args.margin_skins else [None]):
            launch(args, gpus, rows, margin)
    stamp = provenance.stamp()
    text = (f"# MD over ranks, {stamp} UTC, commit {provenance.commit()}, device {args.device}, "
            f"{args.precision}\n\nLJ fcc liquid, density {DENSITY}, T0 {TEMP}, rc {RC}, skin {SKIN}, dt {DT}, NVE. "
            "Speed-up and overhead are against the single-process path on one GPU (while mode).\n\n"
            + table(rows, args) + "\n")
    print(text)
    path = provenance.save(args.out, f"bench_dist_md_{stamp}_{args.device}.md", text)
    provenance.save(args.out, path.with_suffix(".json").name, json.dumps(rows, indent=1))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
