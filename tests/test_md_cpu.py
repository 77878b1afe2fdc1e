"""MD on the CPU: LAMMPS reference table, neighbour list, Langevin, restart, I/O, CLI."""
import gzip
import pathlib

import numpy as np
import pytest

from solvers.kernels.md_ref import philox4x32
from solvers.md import (LennardJones, Langevin, Morse, Simulation, State, UnstableRunError, VelocityVerlet,
                        lattice_state, read_dump)
from solvers.md.__main__ import build_parser, main
from solvers.md.neighbor_cpu import build_pairs

# GUIDE section 7: LAMMPS in.lj from in.lj_init.dump.gz, rebuild check every step.
REFERENCE = {
    0: (1.44, -6.7733681, -4.6134356, -5.0197073),
    10: (1.1253949, -6.3000527, -4.6120132, -2.5596852),
    50: (0.74009346, -5.7315021, -4.6213967, 0.33528742),
    100: (0.75745998, -5.7584998, -4.6223453, 0.20729996),
}
KEYS = ("Temp", "E_pair", "TotEng", "Press")
MORSE_LOG = pathlib.Path(__file__).resolve().parent / "data" / "morse" / "log.lammps"


def lammps_log(path):
    """Thermo columns of a LAMMPS log, as a LAMMPS log reader sees them."""
    lammps_logfile = pytest.importorskip("lammps_logfile")
    log = lammps_logfile.File(str(path))
    return {k: log.get(k) for k in log.get_keywords()}


def morse_reference():
    """The thermo table and list builds of tests/data/morse/log.lammps (read here, so that machines
    without a log-reader package check the same numbers)."""
    lines = MORSE_LOG.read_text().splitlines()
    start = next(k for k, line in enumerate(lines) if line.split()[:1] == ["Step"])
    stop = next(k for k, line in enumerate(lines) if line.startswith("Loop time"))
    names = lines[start].split()
    values = np.array([[float(v) for v in line.split()] for line in lines[start + 1:stop]])
    table = {name: values[:, k] for k, name in enumerate(names)}
    builds = int(next(line for line in lines if line.startswith("Neighbor list builds")).split("=")[1])
    return table, builds


def assert_reference(rows, rtol):
    by_step = {r["Step"]: r for r in rows}
    for step, ref in REFERENCE.items():
        got = [by_step[step][k] for k in KEYS]
        np.testing.assert_allclose(got, ref, rtol=rtol, err_msg=f"step {step}")


@pytest.fixture(scope="module")
def lj_state(md_data_dir):
    return read_dump(str(md_data_dir / "in.lj_init.dump.gz"))


def small_sim(device="cpu", integ=None, cells=(5, 5, 5), **kw):
    return Simulation(lattice_state(cells=cells, temp=1.44, seed=5), LennardJones(rc=2.5, **kw),
                      integ or VelocityVerlet(0.005), device=device)


@pytest.mark.parametrize("mode", ["numpy", "numba"])
def test_reference_table_double(lj_state, mode):
    if mode == "numba":
        pytest.importorskip("numba")
    sim = Simulation(lj_state, LennardJones(rc=2.5), VelocityVerlet(0.005), skin=0.3, device="cpu", mode=mode)
    assert sim.mode == mode
    sim.run(100, thermo_every=10)
    assert_reference(sim.thermo_log, rtol=1e-6)
    assert sim.neighbor_builds == 11
    assert sim.thermo_arrays()["Step"].tolist() == list(range(0, 101, 10))


def test_philox_known_answers():
    # Random123 kat_vectors for philox4x32_10.
    assert [int(v) for v in philox4x32(0, 0, 0, 0, 0, 0)] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    got = philox4x32(0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0)
    assert [int(v) for v in got] == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


@pytest.mark.parametrize("box", [(9.0, 9.0, 9.0), (4.0, 5.0, 12.0)])
def test_pairs_match_brute_force(box):
    box = np.array(box)
    x = np.random.default_rng(3).random((300, 3)) * box
    i, j = build_pairs(x, box, 1.9)
    d = x[None] - x[:, None]
    d -= box * np.rint(d / box)
    r2 = (d ** 2).sum(-1)
    bi, bj = np.nonzero(np.triu(r2 < 1.9 ** 2, 1))
    assert set(zip(np.minimum(i, j), np.maximum(i, j))) == set(zip(bi, bj))
    assert len(i) == len(bi)


def test_energy_conserved_with_shift():
    sim = small_sim(cells=(6, 6, 6), shift=True)
    sim.run(2000, thermo_every=100)  # 10 tau
    e = sim.thermo_arrays()["TotEng"]
    assert np.ptp(e) < 2e-3
    assert abs(e[-1] - e[0]) / 10.0 < 1e-4


def test_langevin_reproducible_and_thermostats():
    def run(seed):
        sim = small_sim(integ=Langevin(0.005, t_target=0.8, damp=0.1, seed=seed))
        sim.run(600, thermo_every=100)
        return sim

    a, b, c = run(7), run(7), run(8)
    np.testing.assert_array_equal(a.positions, b.positions)
    assert not np.array_equal(a.positions, c.positions)
    temps = a.thermo_arrays()["Temp"][2:]
    assert abs(temps.mean() - 0.8) < 0.1


def test_restart_continues_bit_for_bit(tmp_path):
    ref = small_sim(integ=Langevin(0.005, 1.0, 0.5, seed=3))
    ref.run(60, thermo_every=30)
    first = small_sim(integ=Langevin(0.005, 1.0, 0.5, seed=3))
    first.run(30)
    first.write_restart(str(tmp_path / "r.npz"))
    resumed = Simulation.from_restart(str(tmp_path / "r.npz"), device="cpu")
    assert resumed.step == 30
    resumed.run(30)
    np.testing.assert_array_equal(resumed.positions, ref.positions)
    np.testing.assert_array_equal(resumed.velocities, ref.velocities)
    assert resumed.thermo == ref.thermo
    assert resumed.neighbor_builds == ref.neighbor_builds


def test_dumps_round_trip(tmp_path):
    sim = small_sim(cells=(3, 3, 3))
    from solvers.md import DumpWriter
    lmp, xyz = DumpWriter(str(tmp_path / "t.lammpstrj.gz")), DumpWriter(str(tmp_path / "t.xyz"))
    for w in (lmp, xyz):
        sim.run(10, dump=w, dump_every=5)
        w.close()
    back = read_dump(str(tmp_path / "t.lammpstrj.gz"))  # first frame: step 0
    assert back.step == 0 and back.n == 108
    lines = (tmp_path / "t.xyz").read_text().splitlines()
    assert lines[0] == "108" and "Properties=species:S:1:pos:R:3:momenta:R:3:masses:R:1" in lines[1]
    lattice = [float(v) for v in lines[1].split('Lattice="')[1].split('"')[0].split()]
    assert lattice == [sim.state.box[0], 0, 0, 0, sim.state.box[1], 0, 0, 0, sim.state.box[2]]
    assert len(lines) == 3 * 110
    last = np.loadtxt(lines[-108:], usecols=(1, 2, 3))
    np.testing.assert_allclose(last, sim.positions, rtol=0, atol=1e-12)


def test_extxyz_read_by_ase(tmp_path):
    ase_io = pytest.importorskip("ase.io")
    assert main(["--cells", "3", "3", "3", "--steps", "10", "--device", "cpu", "--dump", str(tmp_path / "t.xyz"),
                 "--dump-every", "5", "--restart", str(tmp_path / "r.npz")]) == 0
    assert main(["--resume", str(tmp_path / "r.npz"), "--steps", "0", "--device", "cpu", "--dump",
                 str(tmp_path / "last.xyz"), "--species", "Kr"]) == 0
    frames = ase_io.read(str(tmp_path / "t.xyz"), index=":")
    assert len(frames) == 3 and frames[-1].info["Step"] == 10 and all(frames[-1].pbc)
    assert set(frames[-1].get_chemical_symbols()) == {"Ar"}
    saved = np.load(tmp_path / "r.npz")
    np.testing.assert_array_equal(frames[-1].get_velocities(), saved["velocities"])
    last = ase_io.read(str(tmp_path / "last.xyz"))
    assert set(last.get_chemical_symbols()) == {"Kr"}
    np.testing.assert_array_equal(last.get_velocities(), saved["velocities"])


def test_blowup_is_an_error_not_nan():
    sim = small_sim(integ=VelocityVerlet(0.5))
    with pytest.raises(UnstableRunError, match="blew up"):
        sim.run(200)


def test_overlap_rejected(tmp_path):
    s = lattice_state(cells=(4, 4, 4))
    s.positions[1] = s.positions[0] + 0.01
    with pytest.raises(Exception, match="overlaps"):
        Simulation(State(s.positions, s.velocities, s.box), LennardJones(), VelocityVerlet(), device="cpu")


def write_dump(path, text):
    with gzip.open(path, "wt") as f:
        f.write(text)


@pytest.mark.parametrize("argv, message", [
    (["--cells", "4", "4", "4", "--rc", "4"], "--rc: cutoff 4.0 is larger than half"),
    (["--cells", "4", "4", "4", "--dt", "-0.005"], "--dt: timestep must be positive"),
    (["--cells", "4", "4", "4", "--precision", "mixed", "--device", "cpu"], "--precision"),
    (["--data", "missing.dump"], "missing.dump: no such file"),
])
def test_cli_errors(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_cli_bad_dump_and_overlap(tmp_path, capsys):
    head = "ITEM: TIMESTEP\n0\nITEM: NUMBER OF ATOMS\n2\nITEM: BOX BOUNDS pp pp pp\n0 10\n0 10\n0 10\nITEM: ATOMS id x y z\n"
    write_dump(tmp_path / "short.dump.gz", head + "1 0 0 0\n")
    write_dump(tmp_path / "overlap.dump.gz", head + "1 1 1 1\n2 1 1 1.1\n")
    assert main(["--data", str(tmp_path / "short.dump.gz"), "--device", "cpu"]) == 2
    assert "short.dump.gz: expected 2 atom lines" in capsys.readouterr().err
    assert main(["--data", str(tmp_path / "overlap.dump.gz"), "--rc", "2.5", "--device", "cpu"]) == 2
    assert "overlap.dump.gz: particle 1 overlaps" in capsys.readouterr().err


def test_cli_blowup_exit_1(capsys):
    assert main(["--cells", "4", "4", "4", "--dt", "0.5", "--steps", "200", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "blew up" in err[0]


def test_cli_lammps_log_and_resume(tmp_path, capsys):
    base = ["--cells", "4", "4", "4", "--device", "cpu", "--thermo", "5"]
    assert main(base + ["--steps", "20"]) == 0
    full = capsys.readouterr().out.splitlines()
    assert main(base + ["--steps", "10", "--restart", str(tmp_path / "r.npz")]) == 0
    capsys.readouterr()
    assert main(["--resume", str(tmp_path / "r.npz"), "--steps", "10", "--thermo", "5", "--device", "cpu"]) == 0
    resumed = capsys.readouterr().out.splitlines()
    # Parse like a LAMMPS log reader: from the "Step" header to "Loop time".
    def table(lines):
        start = next(k for k, l in enumerate(lines) if l.startswith("Step ")
                     and l.split()[:5] == ["Step", "Temp", "E_pair", "TotEng", "Press"])
        stop = next(k for k, l in enumerate(lines) if l.startswith("Loop time"))
        return {int(l.split()[0]): l for l in lines[start + 1:stop]}
    t_full, t_res = table(full), table(resumed)
    assert sorted(t_full) == [0, 5, 10, 15, 20] and sorted(t_res) == [10, 15, 20]
    for s in (10, 15, 20):
        assert t_full[s] == t_res[s]
    assert all(len(v.split("e")[0].replace("-", "").replace(".", "").lstrip("0")) >= 8
               for v in t_full[20].split()[1:5])
    assert main(["--resume", str(tmp_path / "r.npz"), "--dt", "0.001"]) == 2


@pytest.mark.parametrize("mode", ["numpy", "numba"])
def test_morse_matches_lammps_reference(mode):
    """tests/data/morse/log.lammps: LAMMPS pair_style morse from the same lattice (make_reference.py)."""
    if mode == "numba":
        pytest.importorskip("numba")
    ref, builds = morse_reference()
    assert {k: v.tolist() for k, v in lammps_log(MORSE_LOG).items()} == {k: v.tolist() for k, v in ref.items()}
    sim = Simulation(lattice_state(0.8442, (6, 6, 6), 1.44, 87287), Morse(1.0, 6.0, 1.122462, rc=2.5),
                     VelocityVerlet(0.005), skin=0.3, device="cpu", mode=mode)
    sim.run(200, thermo_every=50)
    got = sim.thermo_arrays()
    np.testing.assert_array_equal(got["Step"], ref["Step"])
    for key in KEYS:
        np.testing.assert_allclose(got[key], ref[key], rtol=1e-9, err_msg=key)
    assert sim.neighbor_builds == builds == 22


def test_morse_forces_are_the_energy_gradient():
    pot = Morse(0.7, 4.0, 1.2, rc=2.5, shift=True)
    r = np.linspace(0.9, 2.4, 50)
    fr, e, w = pot.terms(r * r)
    h = 1e-6
    de = (pot.terms((r + h) ** 2)[1] - pot.terms((r - h) ** 2)[1]) / (2 * h)
    np.testing.assert_allclose(fr * r, -de, rtol=1e-6)
    np.testing.assert_allclose(w, fr * r * r, rtol=1e-12)
    assert pot.terms(np.array([2.5 ** 2, 3.0 ** 2]))[1].tolist() == [0.0, 0.0]
    assert abs(pot.terms(np.array([2.5 ** 2 * (1 - 1e-12)]))[1][0]) < 1e-9  # shifted to 0 at rc


def test_log_file_parsed_by_lammps_log_reader(tmp_path, capsys):
    log = tmp_path / "md.log"
    assert main(["--cells", "4", "4", "4", "--device", "cpu", "--steps", "20", "--thermo", "5",
                 "--log", str(log)]) == 0
    assert log.read_text() == capsys.readouterr().out
    cols = lammps_log(log)
    assert cols["Step"].tolist() == [0, 5, 10, 15, 20]
    assert {"Temp", "E_pair", "TotEng", "Press", "KinEng", "Volume"} <= set(cols)
    assert cols["Temp"][0] == pytest.approx(1.44)


def test_every_option_has_help():
    undocumented = [a.option_strings for a in build_parser()._actions if a.option_strings and not a.help]
    assert undocumented == []


@pytest.mark.parametrize("option", [["--cells", "5", "5", "5"], ["--temp", "1.0"], ["--seed", "3"],
                                    ["--density", "0.9"], ["--pair", "morse"], ["--rc", "2.0"]])
def test_resume_refuses_physics_options(tmp_path, capsys, option):
    restart = tmp_path / "r.npz"
    assert main(["--cells", "3", "3", "3", "--steps", "5", "--device", "cpu", "--restart", str(restart)]) == 0
    capsys.readouterr()
    assert main(["--resume", str(restart), "--device", "cpu", *option]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{option[0]} cannot be combined with --resume" in err and len(err.splitlines()) == 1
