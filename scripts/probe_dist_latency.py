"""Latency probe for the distributed GPU PCG: where a small-grid iteration's time goes.

Run under MPI on a multi-GPU machine, one rank per GPU::

    mpiexec -n 2 python scripts/probe_dist_latency.py --sizes 64 128

Rank 0 prints, per grid and variant, the time per iteration, the host's time to
enqueue one (Python and driver calls: when it exceeds the iteration time the
GPU waits for the host) and the compute / communication split; then the floor
NCCL sets on the GPU: one allreduce of three doubles and one halo exchange,
each enqueued many times back to back, with their host cost per call.
"""
import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from solvers.distributed import DistributedPCG  # noqa: E402
from solvers.distributed.comm import abort_on_error, world  # noqa: E402
from solvers.distributed.problem import poisson_distributed  # noqa: E402


def enqueue_timer(impl):
    """Wrap ``impl._run_steps`` so it adds its host seconds to the returned list."""
    spent = [0.0]
    run = impl._run_steps

    def timed(steps, events=None):
        t0 = time.perf_counter()
        used = run(steps, events)
        spent[0] += time.perf_counter() - t0
        return used

    impl._run_steps = timed
    return spent


def per_call(enqueue, stream, count):
    """(GPU-bound us per call, host us per call) of ``count`` back-to-back ``enqueue()``."""
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(count):
        enqueue()
    host = time.perf_counter() - t0
    stream.synchronize()
    return (time.perf_counter() - t0) / count * 1e6, host / count * 1e6


def report_floor(impl, comm, size, calls, say):
    """Print what one NCCL allreduce, one halo exchange and one graph launch cost (rank 0)."""
    s, c = impl.stream, impl.comm_stream
    transfers = impl._transfers(impl.x_ext[impl.n:])
    floors = [("NCCL allreduce (3 doubles)", lambda: impl.nccl.allreduce(impl.sums, impl.reduced, 3, s), s),
              (f"NCCL halo exchange ({int(np.sum(comm.allgather(impl.nsend))):,} values over all ranks)",
               lambda: impl.nccl.exchange(transfers, c), c),
              ("graph launch (one small kernel)", lambda: impl._graphs[2].launch(s), s)]
    for name, enqueue, stream in floors:
        device_us, host_us = per_call(enqueue, stream, calls)
        say(f"{size}^3 {name}: {device_us:6.1f} us/call on the GPU, host {host_us:5.1f} us/call", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64])
    ap.add_argument("--iterations", type=int, default=640)
    ap.add_argument("--check-every", type=int, default=32)
    ap.add_argument("--calls", type=int, default=2000, help="back-to-back NCCL calls timed")
    ap.add_argument("--variants", nargs="+", default=["classic", "single-reduction"])
    args = ap.parse_args(argv)
    comm = world()
    say = print if comm.Get_rank() == 0 else (lambda *a, **k: None)
    with abort_on_error(comm):
        for size in args.sizes:
            p = poisson_distributed(comm, (size,) * 3)
            for variant in args.variants:
                solver = DistributedPCG(p.rows, p.bounds, comm, device="gpu", variant=variant, rtol=0.0,
                                        check_every=args.check_every)
                impl = solver._impl
                solver.solve(p.b, maxiter=64)
                spent = enqueue_timer(impl)
                res = solver.solve(p.b, maxiter=args.iterations)
                its = res.iterations
                say(f"{size}^3 ranks {comm.Get_size()} {variant:>16}: "
                    f"{res.loop_time / its * 1e6:7.1f} us/it, host enqueue {spent[0] / its * 1e6:6.1f} us/it, "
                    f"compute {res.compute_time / its * 1e6:6.1f}, comm {res.communication_time / its * 1e6:6.1f}",
                    flush=True)
                say("    last timed iteration, us per step (compute, communication, ...): "
                    + " ".join(f"{ms * 1e3:.1f}" for ms in impl.step_times), flush=True)
            report_floor(impl, comm, size, args.calls, say)
    return 0


if __name__ == "__main__":
    sys.exit(main())
