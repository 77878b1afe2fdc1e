"""One MD simulation over MPI ranks (CPU) against the single-process run, on every rank of an MPI job.

Run as ``mpiexec -n 2 python -m pytest -q tests/test_md_mpi.py`` (and ``-n 3``);
``tests/test_md_parallel.py`` does so. Started without a launcher the module is
skipped. Every assertion compares values that are the same on all ranks, so
every rank passes or fails together.
"""
import numpy as np
import pytest

from solvers.distributed import launch

if launch.world_size() < 2:
    pytest.skip("needs an MPI launch with 2 or more ranks (mpiexec -n 2 python -m pytest ...)",
                allow_module_level=True)

from mpi4py import MPI  # noqa: E402

from solvers.md import Langevin, LennardJones, Morse, Simulation, VelocityVerlet, lattice_state, read_dump  # noqa: E402
from solvers.errors import InputError  # noqa: E402

from test_md_cpu import KEYS, assert_reference  # noqa: E402

COMM = MPI.COMM_WORLD


def pair_of_runs(state, ff, integ, steps, thermo_every, **kw):
    serial = Simulation(state, ff, integ, device="cpu", **kw)
    serial.run(steps, thermo_every=thermo_every)
    spread = Simulation(state, ff, integ, device="cpu", comm=COMM, **kw)
    spread.run(steps, thermo_every=thermo_every)
    return serial, spread


def assert_same_thermo(a, b, rtol):
    assert [r["Step"] for r in a.thermo_log] == [r["Step"] for r in b.thermo_log]
    for ra, rb in zip(a.thermo_log, b.thermo_log):
        np.testing.assert_allclose([rb[k] for k in KEYS + ("KinEng",)], [ra[k] for k in KEYS + ("KinEng",)],
                                   rtol=rtol, err_msg=f"step {ra['Step']}")


@pytest.mark.parametrize("integ", [VelocityVerlet(0.005), Langevin(0.005, 1.0, 0.5, seed=9)], ids=["nve", "langevin"])
def test_200_steps_reproduce_one_process(integ):
    serial, spread = pair_of_runs(lattice_state(cells=(8, 7, 9), seed=3), LennardJones(), integ, 200, 20)
    assert spread.ranks == COMM.size and np.prod(spread.rank_grid) == COMM.size
    assert spread.neighbor_builds == serial.neighbor_builds > 10
    assert_same_thermo(serial, spread, 1e-10)
    whole = spread.get_state()  # gathered on rank 0
    if COMM.rank == 0:
        np.testing.assert_allclose(whole.positions, serial.positions, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(whole.images, serial.get_state().images)
    else:
        assert whole is None
    assert COMM.allreduce(len(spread.positions)) == serial.state.n  # every atom owned once


def test_morse_reproduces_one_process():
    serial, spread = pair_of_runs(lattice_state(cells=(7, 7, 7), seed=4), Morse(rc=2.5, shift=True),
                                  VelocityVerlet(0.005), 100, 50)
    assert spread.neighbor_builds == serial.neighbor_builds
    assert_same_thermo(serial, spread, 1e-10)


def test_reference_table(md_data_dir):
    sim = Simulation(read_dump(str(md_data_dir / "in.lj_init.dump.gz")), LennardJones(rc=2.5),
                     VelocityVerlet(0.005), skin=0.3, device="cpu", comm=COMM)
    sim.run(100, thermo_every=10)
    assert_reference(sim.thermo_log, rtol=1e-6)
    assert sim.neighbor_builds == 11


def test_restart_between_rank_counts(tmp_path_factory):
    path = COMM.bcast(str(tmp_path_factory.mktemp("restart") / "r.npz") if COMM.rank == 0 else None)
    state, ff, integ = lattice_state(cells=(8, 8, 8), seed=6), LennardJones(), Langevin(0.005, 1.0, 0.5, seed=2)
    serial = Simulation(state, ff, integ, device="cpu")
    serial.run(60)
    spread = Simulation(state, ff, integ, device="cpu", comm=COMM)
    spread.run(30)
    spread.write_restart(path)  # written by N ranks
    COMM.barrier()
    alone = Simulation.from_restart(path, device="cpu")  # resumed by one
    alone.run(30)
    np.testing.assert_allclose(alone.positions, serial.positions, rtol=0, atol=1e-9)
    assert alone.neighbor_builds == serial.neighbor_builds
    again = Simulation.from_restart(path, device="cpu", comm=COMM)  # and by N again
    again.run(30)
    np.testing.assert_allclose([again.thermo[k] for k in KEYS], [serial.thermo[k] for k in KEYS], rtol=1e-10)


def test_dump_frames_gathered_on_rank_0(tmp_path_factory):
    from solvers.md import DumpWriter
    folder = COMM.bcast(str(tmp_path_factory.mktemp("dump")) if COMM.rank == 0 else None)
    state = lattice_state(cells=(6, 6, 6), seed=8)
    serial = Simulation(state, LennardJones(), VelocityVerlet(), device="cpu")
    spread = Simulation(state, LennardJones(), VelocityVerlet(), device="cpu", comm=COMM)
    if COMM.rank == 0:
        with_serial = DumpWriter(f"{folder}/serial.lammpstrj")
        serial.run(20, dump=with_serial, dump_every=10)
        with_serial.close()
    dump = DumpWriter(f"{folder}/spread.lammpstrj") if COMM.rank == 0 else None
    spread.run(20, dump=dump, dump_every=10)
    if dump is not None:
        dump.close()
        serial_lines = open(f"{folder}/serial.lammpstrj").read().splitlines()
        spread_lines = open(f"{folder}/spread.lammpstrj").read().splitlines()
        assert len(serial_lines) == len(spread_lines) == 3 * (9 + state.n)
        ids = [int(l.split()[0]) for l in spread_lines if len(l.split()) == 8]
        assert ids == [int(l.split()[0]) for l in serial_lines if len(l.split()) == 8]
        got = np.array([[float(v) for v in l.split()[2:]] for l in spread_lines if len(l.split()) == 8])
        want = np.array([[float(v) for v in l.split()[2:]] for l in serial_lines if len(l.split()) == 8])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)


def test_too_many_ranks_for_the_box_is_an_input_error_everywhere():
    # Box edge 5.04, rc + skin 2.6: two sub-boxes along an edge would be 2.52 wide.
    with pytest.raises(InputError, match="cannot split the box"):
        Simulation(lattice_state(cells=(3, 3, 3)), LennardJones(rc=2.5), VelocityVerlet(), skin=0.1,
                   device="cpu", comm=COMM)


def test_ranks_asking_for_different_runs_is_an_input_error_everywhere():
    sim = Simulation(lattice_state(cells=(6, 6, 6)), LennardJones(), VelocityVerlet(0.005), device="cpu", comm=COMM)
    with pytest.raises(InputError, match="different runs"):
        sim.run(10 + COMM.Get_rank())
    sim.run(5)  # a refused call leaves the simulation usable
    assert sim.step == 5
