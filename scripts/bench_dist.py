"""Distributed PCG benchmark: 1 versus N GPUs on 3D Poisson, both variants.

Run on a multi-GPU machine::

    python scripts/bench_dist.py --gpus 1 2 --sizes 256 320 --small 64
    python scripts/bench_dist.py --gpus 1 2 4 8 --sizes 320 400          # strong scaling
    python scripts/bench_dist.py --gpus 1 2 4 8 --weak 16000000          # 16M rows per GPU

For every GPU count and grid size it starts one MPI job (``mpiexec -n G``, or
``--mpiexec``) whose ranks each generate their own rows of the Poisson
matrix, so sizes beyond one GPU's memory work. Each job runs both variants for
a fixed number of iterations (``rtol = 0``) and reports the time per iteration
and its compute / communication split; the 1-GPU jobs also time the
single-process solver (``solvers.PCG``, while and graph modes) on the same matrix. The
table is printed and saved under ``scripts/results/`` with the date.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
import provenance  # noqa: E402

VARIANTS = ("classic", "single-reduction")  # of the distributed runs
SINGLE_MODES = ("while", "graph")  # the single-process references on one GPU
TAG = "BENCH "


def worker(args):
    """One MPI job: build the rows of this rank, time both variants; rank 0 prints JSON lines."""
    import numpy as np

    from solvers.distributed import DistributedPCG
    from solvers.distributed.comm import abort_on_error, world
    from solvers.distributed.problem import poisson_distributed

    comm = world()
    with abort_on_error(comm):
        shape = (args.size,) * 3
        t0 = time.perf_counter()
        p = poisson_distributed(comm, shape)
        generate = comm.allreduce(time.perf_counter() - t0, op=_max())
        rows = []
        for variant in VARIANTS:
            solver = DistributedPCG(p.rows, p.bounds, comm, device=args.device, variant=variant, rtol=0.0,
                                    check_every=args.check_every)
            solver.solve(p.b, maxiter=20)  # compile, capture, warm up NCCL
            runs = [solver.solve(p.b, maxiter=args.iterations) for _ in range(args.repeats)]
            best = min(runs, key=lambda r: r.loop_time)
            its = best.iterations
            rows.append(dict(variant=variant, us_per_it=best.loop_time / its * 1e6,
                             compute_us=best.compute_time / its * 1e6,
                             comm_us=best.communication_time / its * 1e6, setup_s=solver.setup_time,
                             iterations=its, device=solver.device_name or "cpu"))
            del solver
        if comm.Get_size() == 1:
            from solvers.pcg import PCG
            for mode in SINGLE_MODES if args.device == "gpu" else ("auto",):
                single = PCG(p.rows, device=args.device, mode=mode, rtol=0.0)
                single.solve(p.b, maxiter=20)
                runs = [single.solve(p.b, maxiter=args.iterations) for _ in range(args.repeats)]
                best = min(runs, key=lambda r: r.loop_time)
                rows.append(dict(variant=f"single-process {mode}", us_per_it=best.loop_time / best.iterations * 1e6,
                                 compute_us=None, comm_us=None, setup_s=single.setup_time,
                                 iterations=best.iterations,
                                 device=getattr(single, "device_name", None) or "cpu"))
                del single
        if comm.Get_rank() == 0:
            for row in rows:
                row.update(gpus=comm.Get_size(), size=args.size, n=int(np.prod(shape)), nnz=p.nnz,
                           generate_s=generate)
                print(TAG + json.dumps(row), flush=True)


def _max():
    from mpi4py import MPI
    return MPI.MAX


def run_job(gpus, size, args):
    """Start one worker job; return its result rows (empty, with the error printed, on failure)."""
    from solvers.distributed.launch import mpiexec_command

    env = {**os.environ, "PYTHONPATH": str(REPO), "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0")}
    cmd = [*mpiexec_command(gpus, env, args.mpiexec), sys.executable, __file__, "--worker", "--size", str(size),
           "--iterations", str(args.iterations), "--repeats", str(args.repeats),
           "--check-every", str(args.check_every), "--device", args.device]
    print(f"# {gpus} GPU(s), {size}^3 ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    rows = [json.loads(line[len(TAG):]) for line in proc.stdout.splitlines() if line.startswith(TAG)]
    if proc.returncode != 0 or not rows:
        print(f"# job failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}", file=sys.stderr)
    return rows


def table(rows, weak=False):
    """Markdown table of the rows, with speed-ups (strong scaling) or efficiencies (weak scaling).

    Strong: speed-up against the faster single-process mode on 1 GPU and against 1 rank of the same
    variant, on the same grid; overhead over the single-process graph mode (host-relaunched graphs,
    the multi-rank driver's closest single-GPU counterpart). Weak: time on 1 GPU over time on N GPUs,
    same variant, each with its own grid.
    """
    def find(gpus, variant, size=None):
        return next((r for r in rows if r["gpus"] == gpus and r["variant"] == variant
                     and (size is None or r["size"] == size)), None)

    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    ratio = lambda ref, r: f"{ref['us_per_it'] / r['us_per_it']:.2f}x" if ref else "-"  # noqa: E731
    if weak:
        head = "weak-scaling efficiency vs 1 GPU same variant |"
    else:
        head = ("speed-up vs 1 GPU single-process (faster mode) | vs 1 rank same variant | "
                "overhead vs 1 GPU single-process graph (us) |")
    lines = ["| grid | n | GPUs | variant | us / iteration | compute us | comm. us | " + head,
             "|---" * (7 + head.count("|")) + "|"]
    for r in sorted(rows, key=lambda r: (r["size"], r["gpus"], r["variant"])):
        cells = [f"{r['size']}^3", f"{r['n']:,}", str(r["gpus"]), r["variant"], f"{r['us_per_it']:.1f}",
                 fmt(r["compute_us"]), fmt(r["comm_us"])]
        if weak:
            cells.append(ratio(find(1, r["variant"]), r))
        else:
            singles = [s for s in (find(1, f"single-process {m}", r["size"]) for m in SINGLE_MODES) if s]
            ref = min(singles, key=lambda s: s["us_per_it"], default=None)
            graph, one = find(1, "single-process graph", r["size"]), find(1, r["variant"], r["size"])
            cells += [ratio(ref, r), ratio(one, r) if r["gpus"] > 1 else "-",
                      fmt(r["us_per_it"] - graph["us_per_it"]) if graph and r not in singles else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="GPU counts (one rank per GPU)")
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 320], help="grid points per axis (strong scaling)")
    p.add_argument("--small", type=int, nargs="*", default=[64], help="small grids for the overhead figure")
    p.add_argument("--weak", type=float, help="rows per GPU: the grid grows with the GPU count (weak scaling)")
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--check-every", type=int, default=32, help="iterations between host status reads")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="cpu: smoke test of the script")
    p.add_argument("--mpiexec", default=os.environ.get("GRAPHSOLVE_MPIEXEC", "mpiexec"))
    p.add_argument("--timeout", type=int, default=900, help="seconds per MPI job")
    p.add_argument("--out", default=str(REPO / "scripts" / "results"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0

    if args.weak:
        jobs = [(g, round((args.weak * g) ** (1 / 3))) for g in args.gpus]
    else:
        jobs = [(g, s) for s in sorted(set(args.small + args.sizes)) for g in args.gpus]
    stamp = provenance.stamp()
    name = f"bench_dist_{stamp}_{'weak' if args.weak else 'strong'}_{'-'.join(map(str, args.gpus))}gpu"
    rows = []
    for gpus, size in jobs:
        rows += run_job(gpus, size, args)
        if not rows:
            continue
        # Saved after every job, so an interrupted run keeps what it measured.
        text = (f"# Distributed PCG, 3D Poisson (7-point), Jacobi, float64\n\n"
                f"{stamp} UTC, {rows[0]['device']}, commit {provenance.commit()}, "
                f"{args.iterations} iterations per timing "
                f"(best of {args.repeats}), host status read every {args.check_every} iterations.\n\n"
                + table(rows, bool(args.weak)) + "\n")
        provenance.save(args.out, f"{name}.md", text)
        provenance.save(args.out, f"{name}.json", json.dumps(rows, indent=1))
    if not rows:
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
