"""MD on the GPU: reference table in every mode, mode agreement, overflow recovery, drift, restart."""
import numpy as np
import pytest

from solvers.md import Langevin, LennardJones, Simulation, UnstableRunError, VelocityVerlet, lattice_state, read_dump
from solvers.md.__main__ import main
from solvers.md.neighbor_cpu import build_pairs

from test_md_cpu import REFERENCE, assert_reference

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def lj_state(md_data_dir):
    return read_dump(str(md_data_dir / "in.lj_init.dump.gz"))


def host(a):
    return a.get()


@pytest.mark.parametrize("mode", ["eager", "graph", "while"])
def test_reference_table_double(lj_state, mode):
    sim = Simulation(lj_state, LennardJones(rc=2.5), VelocityVerlet(0.005), device="gpu", mode=mode,
                     precision="double")
    assert sim.mode == mode
    sim.run(100, thermo_every=10)
    assert_reference(sim.thermo_log, rtol=1e-6)
    assert sim.neighbor_builds == 11


def test_reference_table_mixed(lj_state):
    sim = Simulation(lj_state, LennardJones(rc=2.5), VelocityVerlet(0.005), device="gpu", mode="while")
    assert sim.precision == "mixed" and sim.positions.dtype == np.float32
    sim.run(100, thermo_every=10)
    assert_reference(sim.thermo_log, rtol=1e-4)


@pytest.mark.parametrize("precision", ["double", "mixed"])
def test_modes_agree_bit_for_bit(precision):
    out = {}
    for mode in ("eager", "graph", "while"):
        sim = Simulation(lattice_state(cells=(10, 10, 10)), LennardJones(), Langevin(0.005, 1.2, 0.5, seed=11),
                         device="gpu", mode=mode, precision=precision, unroll=7)
        sim.run(150, thermo_every=40)
        out[mode] = (host(sim.positions), host(sim.velocities), sim.thermo_log, sim.neighbor_builds)
    for mode in ("eager", "graph"):
        np.testing.assert_array_equal(out[mode][0], out["while"][0])
        np.testing.assert_array_equal(out[mode][1], out["while"][1])
        assert out[mode][2] == out["while"][2] and out[mode][3] == out["while"][3]


def test_matches_cpu_with_langevin():
    def sim(device):
        return Simulation(lattice_state(cells=(8, 8, 8)), LennardJones(shift=True), Langevin(0.005, 1.0, 0.3, seed=5),
                          device=device, precision="double")
    cpu, gpu = sim("cpu"), sim("gpu")
    cpu.run(30, thermo_every=10)
    gpu.run(30, thermo_every=10)
    np.testing.assert_allclose(host(gpu.positions), cpu.positions, rtol=0, atol=1e-9)
    for a, b in zip(gpu.thermo_log, cpu.thermo_log):
        np.testing.assert_allclose([a[k] for k in REFERENCE_KEYS], [b[k] for k in REFERENCE_KEYS], rtol=1e-9)


REFERENCE_KEYS = ("Temp", "E_pair", "TotEng", "Press")


@pytest.mark.parametrize("mode, by_cell", [("graph", False), ("while", False), ("while", True)])
def test_list_overflow_redoes_the_chunk(lj_state, mode, by_cell):
    i, j = build_pairs(lj_state.positions, lj_state.box, 2.8)
    exact = int(np.bincount(np.concatenate([i, j])).max())  # perfect lattice: every particle the same
    ref = Simulation(lj_state, LennardJones(), VelocityVerlet(), device="gpu", mode=mode, precision="double",
                     cell_order=by_cell)
    ref.run(60, thermo_every=20)
    for capacity in (exact, 4):  # overflows in the run / already at setup
        sim = Simulation(lj_state, LennardJones(), VelocityVerlet(), device="gpu", mode=mode, precision="double",
                         neighbor_capacity=capacity, cell_order=by_cell)
        sim.run(60, thermo_every=20)
        assert sim._backend.regrows >= 1 and sim._backend.maxnb > exact
        np.testing.assert_array_equal(host(sim.positions), host(ref.positions))
        assert sim.thermo_log == ref.thermo_log and sim.neighbor_builds == ref.neighbor_builds


@pytest.mark.parametrize("precision", ["mixed", "double"])
def test_energy_drift_shifted(lj_state, precision):
    sim = Simulation(lj_state, LennardJones(shift=True), VelocityVerlet(0.005), device="gpu", mode="while",
                     precision=precision)
    sim.run(10000, thermo_every=250)  # 50 tau
    t = sim.thermo_arrays()
    keep = t["Step"] >= 1000  # after the lattice melts
    slope = np.polyfit(t["Step"][keep] * 0.005, t["TotEng"][keep], 1)[0]
    assert abs(slope) < 1e-5, slope
    assert 900 < sim.neighbor_builds < 1600


def test_restart_bit_for_bit(tmp_path):
    def make():
        return Simulation(lattice_state(cells=(10, 10, 10)), LennardJones(), Langevin(0.005, 1.0, 0.5, seed=2),
                          device="gpu", mode="while")
    ref = make()
    ref.run(80)
    first = make()
    first.run(40)
    first.write_restart(str(tmp_path / "r.npz"))
    resumed = Simulation.from_restart(str(tmp_path / "r.npz"), device="gpu", mode="graph")
    resumed.run(40)
    np.testing.assert_array_equal(host(resumed.positions), host(ref.positions))
    np.testing.assert_array_equal(host(resumed.velocities), host(ref.velocities))
    assert resumed.thermo == ref.thermo


def test_blowup_detected_on_device():
    sim = Simulation(lattice_state(cells=(6, 6, 6)), LennardJones(), VelocityVerlet(0.5), device="gpu", mode="while")
    with pytest.raises(UnstableRunError, match="blew up"):
        sim.run(300, thermo_every=100)


def test_cli_gpu_double_table(md_data_dir, capsys):
    argv = ["--data", str(md_data_dir / "in.lj_init.dump.gz"), "--device", "gpu", "--precision", "double",
            "--thermo", "50", "--steps", "100"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {int(l.split()[0]): [float(v) for v in l.split()[1:5]] for l in lines if l.split() and l.split()[0].isdigit()}
    np.testing.assert_allclose(rows[100], REFERENCE[100], rtol=1e-6)
    assert "Neighbor list builds = 11" in lines


def test_lanes_per_particle_change_only_rounding():
    sums = []
    for tpp in (1, 4, 32):
        sim = Simulation(lattice_state(cells=(8, 8, 8)), LennardJones(), VelocityVerlet(), device="gpu",
                         mode="while", precision="double", threads_per_particle=tpp)
        sim.run(100, thermo_every=50)
        sums.append([sim.thermo[k] for k in REFERENCE_KEYS] + [sim.neighbor_builds])
    np.testing.assert_allclose(sums[1], sums[0], rtol=1e-10)
    np.testing.assert_allclose(sums[2], sums[0], rtol=1e-10)


@pytest.mark.parametrize("tpp", [1, 32])
def test_list_built_in_cell_order_is_the_same(tpp):
    out = []
    for by_cell in (False, True):
        sim = Simulation(lattice_state(cells=(8, 8, 8)), LennardJones(), Langevin(0.005, 1.0, 0.5, seed=4),
                         device="gpu", mode="while", threads_per_particle=tpp, cell_order=by_cell)
        sim.run(120, thermo_every=60)
        out.append((host(sim.positions), sim.thermo_log, sim.neighbor_builds))
    np.testing.assert_array_equal(out[0][0], out[1][0])  # same forces per particle, bit for bit
    assert out[0][2] == out[1][2] > 5
    for a, b in zip(out[0][1], out[1][1]):  # thermo sums are added in another order
        np.testing.assert_allclose([a[k] for k in REFERENCE_KEYS], [b[k] for k in REFERENCE_KEYS], rtol=1e-12)


@pytest.mark.parametrize("tpp", [1, 8])
def test_lists_built_in_run_or_between_launches_are_the_same(monkeypatch, tpp):
    import solvers.md.gpu as md_gpu

    def run():
        sim = Simulation(lattice_state(cells=(8, 8, 8)), LennardJones(), Langevin(0.005, 1.0, 0.5, seed=4),
                         device="gpu", mode="while", threads_per_particle=tpp, cell_order=True)
        sim.run(120, thermo_every=60)
        return host(sim.positions), sim.thermo_log, sim.neighbor_builds

    flat = run()  # a small system: lists rebuilt inside md_run_rebuilding, flat walk (tpp >= 2)
    monkeypatch.setattr(md_gpu, "_SMALL_SYSTEM_MAX", 0)
    monkeypatch.setattr(md_gpu, "rebuilds_in_run", lambda *args: False)
    nested = run()  # as a large one: md_run, the IF node's kernels, nested walk
    np.testing.assert_array_equal(flat[0], nested[0])  # same lists, same order: the same run, bit for bit
    assert flat[2] == nested[2] > 5
    for a, b in zip(flat[1], nested[1]):  # thermo sums are added in another order
        np.testing.assert_allclose([a[k] for k in REFERENCE_KEYS], [b[k] for k in REFERENCE_KEYS], rtol=1e-12)


@pytest.mark.parametrize("precision, rtol", [("double", 1e-8), ("mixed", 1e-4)])
def test_morse_matches_lammps(precision, rtol):
    from test_md_cpu import KEYS, morse_reference
    from solvers.md import Morse
    ref, _ = morse_reference()
    sim = Simulation(lattice_state(0.8442, (6, 6, 6), 1.44, 87287), Morse(1.0, 6.0, 1.122462, rc=2.5),
                     VelocityVerlet(0.005), device="gpu", mode="while", precision=precision)
    sim.run(200, thermo_every=50)
    for key in KEYS:
        np.testing.assert_allclose(sim.thermo_arrays()[key], ref[key], rtol=rtol, err_msg=key)
    if precision == "double":
        assert sim.neighbor_builds == 22
