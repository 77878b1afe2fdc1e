"""One MD simulation over GPU ranks (one GPU each) against one GPU and the CPU, on every rank of an MPI job.

Run on a machine with 2 GPUs as ``mpirun -n 2 -x NCCL_NVLS_ENABLE=0 python -m pytest -q
tests/test_md_gpu_mpi.py`` (``tests/test_md_gpu_parallel.py`` does so). Skipped without an
MPI launch; the ``gpu`` marker skips it without a GPU unless ``REQUIRE_GPU=1``.
"""
import numpy as np
import pytest

from solvers.distributed import launch

if launch.world_size() < 2:
    pytest.skip("needs an MPI launch with 2 or more ranks, one GPU each", allow_module_level=True)

from mpi4py import MPI  # noqa: E402

from solvers.md import Langevin, LennardJones, Morse, Simulation, VelocityVerlet, lattice_state, read_dump  # noqa: E402

from test_md_cpu import KEYS, assert_reference, morse_reference  # noqa: E402

pytestmark = pytest.mark.gpu
COMM = MPI.COMM_WORLD


def thermo_of(sim):
    return [[r[k] for k in KEYS] for r in sim.thermo_log]


@pytest.mark.parametrize("integ", [VelocityVerlet(0.005), Langevin(0.005, 1.0, 0.5, seed=9)], ids=["nve", "langevin"])
def test_200_steps_reproduce_one_process(integ, monkeypatch):
    from solvers.md import parallel_gpu
    monkeypatch.setattr(parallel_gpu, "MARGIN_SKINS", 1.0)  # builds with and without migration in 200 steps
    state = lattice_state(cells=(10, 9, 11), seed=3)
    cpu = Simulation(state, LennardJones(), integ, device="cpu")
    cpu.run(200, thermo_every=20)
    spread = Simulation(state, LennardJones(), integ, device="gpu", precision="double", comm=COMM)
    assert spread.device == "gpu" and spread.ranks == COMM.size
    spread.run(200, thermo_every=20)
    assert spread.neighbor_builds == cpu.neighbor_builds > 10
    assert 0 < spread.migrations < spread.neighbor_builds  # builds on the ghosts held, and with migration
    np.testing.assert_allclose(thermo_of(spread), thermo_of(cpu), rtol=1e-10)
    whole = spread.get_state()
    if COMM.rank == 0:
        np.testing.assert_allclose(whole.positions, cpu.positions, rtol=0, atol=1e-9)


def test_lists_too_small_on_one_rank_are_grown_and_every_rank_redoes_the_steps():
    from solvers.kernels import md_params
    state = lattice_state(cells=(10, 9, 11), seed=3)
    cpu = Simulation(state, LennardJones(), VelocityVerlet(0.005), device="cpu")
    cpu.run(100, thermo_every=20)
    spread = Simulation(state, LennardJones(), VelocityVerlet(0.005), device="gpu", precision="double", comm=COMM)
    b = spread._backend
    if COMM.rank == 1:  # the next list build (on the device) overflows here only
        with b.stream:
            b.maxnb = int(b.ncount[:b.n].max().get()) // 2
            b.params = md_params.pack(b._real_c, b._pair, b._param_values())
            b._capture_step()
    spread.run(100, thermo_every=20)
    assert COMM.allreduce(b.regrows) >= 1
    assert spread.neighbor_builds == cpu.neighbor_builds
    np.testing.assert_allclose(thermo_of(spread), thermo_of(cpu), rtol=1e-10)


def test_reference_table(md_data_dir):
    sim = Simulation(read_dump(str(md_data_dir / "in.lj_init.dump.gz")), LennardJones(rc=2.5),
                     VelocityVerlet(0.005), device="gpu", precision="double", comm=COMM)
    sim.run(100, thermo_every=10)
    assert_reference(sim.thermo_log, rtol=1e-6)
    assert sim.neighbor_builds == 11
    mixed = Simulation(read_dump(str(md_data_dir / "in.lj_init.dump.gz")), LennardJones(rc=2.5),
                       VelocityVerlet(0.005), device="gpu", comm=COMM)
    assert mixed.precision == "mixed"
    mixed.run(100, thermo_every=10)
    assert_reference(mixed.thermo_log, rtol=1e-4)


def test_morse_matches_lammps():
    ref, _ = morse_reference()
    sim = Simulation(lattice_state(0.8442, (6, 6, 6), 1.44, 87287), Morse(1.0, 6.0, 1.122462, rc=2.5),
                     VelocityVerlet(0.005), device="gpu", precision="double", comm=COMM)
    sim.run(200, thermo_every=50)
    for key in KEYS:
        np.testing.assert_allclose(sim.thermo_arrays()[key], ref[key], rtol=1e-8, err_msg=key)


def test_restart_between_gpu_ranks_and_one_gpu(tmp_path_factory):
    path = COMM.bcast(str(tmp_path_factory.mktemp("restart") / "r.npz") if COMM.rank == 0 else None)
    state, integ = lattice_state(cells=(10, 10, 10), seed=6), Langevin(0.005, 1.0, 0.5, seed=2)
    spread = Simulation(state, LennardJones(), integ, device="gpu", precision="double", comm=COMM)
    spread.run(30)
    spread.write_restart(path)
    spread.run(30)
    COMM.barrier()
    alone = Simulation.from_restart(path, device="gpu")
    alone.run(30)
    np.testing.assert_allclose([alone.thermo[k] for k in KEYS], [spread.thermo[k] for k in KEYS], rtol=1e-10)
    assert alone.neighbor_builds == spread.neighbor_builds


def test_blowup_stops_every_rank():
    from solvers.md import UnstableRunError
    sim = Simulation(lattice_state(cells=(8, 8, 8)), LennardJones(), VelocityVerlet(0.5), device="gpu", comm=COMM)
    with pytest.raises(UnstableRunError, match="blew up"):
        sim.run(100, thermo_every=50)


def test_list_build_kernels_match_their_references():
    import cupy as cp
    from solvers.kernels import md_ref
    from solvers.kernels.md_params import ROUTES
    sim = Simulation(lattice_state(cells=(10, 9, 11), seed=3), LennardJones(), VelocityVerlet(0.005), device="gpu",
                     precision="mixed", comm=COMM)
    sim.run(40)
    b = sim._backend
    offsets = [o for o, _, _ in b.domain.routes()]
    with b.stream:
        split = int(np.argmax(b.domain.grid))
        # into the middle of the next rank's sub-box (own atoms may have drifted out of mine by the ghost margin)
        b.frame[:3, split] = cp.asarray(b.domain.lo[split] + 1.5 * b.domain.width[split] - b.origin[split],
                                        dtype=b.real)
        x, v, img = b.frame[:b.n].get(), b.v.get(), b.img.get()
        rec, keys = (a.get() for a in b._records())
        ref = md_ref.migration_records(x, v, img, b.gidx.get(), b.ids.get(), b.origin, b.box, b.domain.width,
                                       b.domain.grid)
        np.testing.assert_array_equal(rec, ref)
        assert (rec[:3, md_ref.RECORD_OWNER] != COMM.rank).all()
        np.testing.assert_array_equal(keys, md_ref.migration_keys(rec, b.domain.coords, b.domain.grid, offsets))
        for got, want in zip(b._unpack(cp.asarray(rec)), md_ref.unpack_records(rec, b.origin, b.real)):
            np.testing.assert_array_equal(got.get()[:, :3] if got.ndim == 2 else got.get(), want)
        global_x = x[:, :3].astype(np.float64) + b.origin
        masks = b._route_masks(b.frame[:b.n]).get()
        np.testing.assert_array_equal(masks, b.domain.route_masks(global_x, b.reach))
        for mask, nkeys in ((masks, ROUTES), (keys, md_ref.MIGRATION_KEYS)):
            index, key, per_key = b._partition(cp.asarray(mask), nkeys)
            want_index, want_key = md_ref.partition_bits(mask, nkeys)
            np.testing.assert_array_equal(index.get(), want_index)
            np.testing.assert_array_equal(key.get(), want_key)
            np.testing.assert_array_equal(per_key, np.bincount(want_key, minlength=nkeys))
