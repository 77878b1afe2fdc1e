"""MD files and options as a hostile user meets them: damaged restarts, full disks, signals, huge systems."""
import gzip
import json
import os
import stat
import zipfile

import numpy as np
import pytest

from solvers import resources
from solvers.errors import InputError
from solvers.md import DumpWriter, read_dump
from solvers.md.__main__ import main
from solvers.md.io import read_restart

from contract import assert_one_line_error, leftovers, run_python

BASE = ["--cells", "3", "3", "3", "--device", "cpu"]
DUMP_HEAD = "ITEM: TIMESTEP\n0\nITEM: NUMBER OF ATOMS\n{n}\nITEM: BOX BOUNDS pp pp pp\n{bounds}\nITEM: ATOMS id x y z\n"


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def restart(tmp_path_factory):
    """A valid restart file (108 atoms, Langevin) and its contents."""
    path = tmp_path_factory.mktemp("restart") / "good.npz"
    assert main(BASE + ["--steps", "5", "--thermostat", "langevin", "--restart", str(path)]) == 0
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    return path, arrays, json.loads(str(arrays["meta"]))


def _damaged(tmp_path, restart, case):
    path, arrays, meta = restart
    good = path.read_bytes()
    out = tmp_path / f"{case}.npz"

    def save(**changes):
        data = {**arrays, **changes}
        np.savez(out, **{k: v for k, v in data.items() if v is not None})

    def meta_with(**changes):
        m = {**meta, **changes}
        return np.array(json.dumps({k: v for k, v in m.items() if v is not None}))

    if case.startswith("truncated"):
        out.write_bytes(good[:int(len(good) * float(case.split("-")[1]))])
    elif case == "empty":
        out.write_bytes(b"")
    elif case == "npy":
        out = tmp_path / "positions.npy"
        np.save(out, arrays["positions"])
    elif case == "flipped byte":
        data = bytearray(good)
        data[len(data) // 2] ^= 0xFF
        out.write_bytes(bytes(data))
    elif case == "no meta":
        save(meta=None)
    elif case == "meta not json":
        save(meta=np.array("{dt: 0.005"))
    elif case == "no dt":
        save(meta=meta_with(dt=None))
    elif case == "dt as text":
        save(meta=meta_with(dt="0.005"))
    elif case == "unknown thermostat":
        save(meta=meta_with(thermostat="berendsen"))
    elif case == "negative step":
        save(meta=meta_with(step=-3))
    elif case == "seed too large":
        save(meta=meta_with(seed=2 ** 64))
    elif case == "no positions":
        save(positions=None)
    elif case == "wrong shape":
        save(velocities=arrays["velocities"][:, :2])
    elif case == "10 ids for 108 atoms":
        save(ids=arrays["ids"][:10])
    elif case == "float32 in double run":
        save(forces=arrays["forces"].astype(np.float32))
    elif case == "nan velocities":
        save(velocities=arrays["velocities"] * np.nan)
    elif case == "repeated ids":
        save(ids=np.ones_like(arrays["ids"]))
    elif case == "zero box":
        save(box=np.zeros(3))
    elif case == "version 2":
        save(meta=meta_with(version=2))
    elif case == "pickled meta":
        with zipfile.ZipFile(out, "w") as z:
            for key, value in arrays.items():
                with z.open(f"{key}.npy", "w") as f:
                    np.lib.format.write_array(f, np.array([meta], dtype=object) if key == "meta" else value,
                                              allow_pickle=True)
    return out


DAMAGE = ["truncated-0.1", "truncated-0.5", "truncated-0.99", "empty", "npy", "flipped byte", "no meta",
          "meta not json", "no dt", "dt as text", "unknown thermostat", "negative step", "seed too large",
          "no positions", "wrong shape", "10 ids for 108 atoms", "float32 in double run", "nan velocities",
          "repeated ids", "zero box", "version 2", "pickled meta"]


@pytest.mark.parametrize("case", DAMAGE)
def test_damaged_restart_is_one_line_naming_the_file(capsys, tmp_path, restart, case):
    path = _damaged(tmp_path, restart, case)
    with pytest.raises(InputError) as info:
        read_restart(str(path))
    assert str(path) in str(info.value)
    code, out, err = run_cli(capsys, "--resume", path, "--steps", "2", "--device", "cpu")
    assert code == 2 and out == ""
    assert_one_line_error(err, path)


def test_valid_restart_still_continues(capsys, restart):
    path, arrays, meta = restart
    state, saved, params = read_restart(str(path))
    assert state.n == 108 and params["thermostat"] == "langevin" and saved["positions"].dtype == np.float64
    code, out, _ = run_cli(capsys, "--resume", path, "--steps", "2", "--device", "cpu")
    assert code == 0 and "Loop time" in out


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_restart_to_a_non_regular_path_is_refused_before_the_run(capsys, tmp_path, kind):
    path = "/dev/null" if kind == "device" else tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    mode = os.stat(path).st_mode
    code, out, err = run_cli(capsys, *BASE, "--steps", "2", "--restart", path)
    assert code == 2 and out == ""  # refused before the run
    assert_one_line_error(err, path, "only regular files are replaced")
    assert os.stat(path).st_mode == mode


@pytest.mark.parametrize("option, name", [("--dump", "t.dump"), ("--dump", "t.dump.gz"), ("--dump", "t.xyz"),
                                          ("--restart", "r.npz")])
def test_full_disk_during_dump_or_restart_keeps_the_previous_file(tmp_path, option, name):
    target = tmp_path / name
    target.write_bytes(b"previous run")
    proc = run_python(["-m", "solvers.md", *BASE, "--steps", "20", "--dump-every", "5", option, target],
                      cwd=tmp_path, file_size_limit=6000)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, target, "cannot write")
    assert target.read_bytes() == b"previous run" and leftovers(tmp_path) == []


SIGNAL_DURING_DUMP = """
import os, signal, sys
from solvers.md import io
real = io.DumpWriter._write
calls = [0]
def write(self, step, time, state):
    calls[0] += 1
    if calls[0] == 3:   # in the middle of the third frame
        os.kill(os.getpid(), signal.SIGTERM)
    real(self, step, time, state)
io.DumpWriter._write = write
from solvers.md.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_during_a_dump_leaves_complete_frames(tmp_path):
    target = tmp_path / "t.dump.gz"
    proc = run_python(["-c", SIGNAL_DURING_DUMP, *BASE, "--steps", "50", "--dump-every", "5", "--dump", target,
                       "--restart", tmp_path / "r.npz"], cwd=tmp_path)
    assert proc.returncode == 143
    assert_one_line_error(proc.stderr, "interrupted by SIGTERM")
    with gzip.open(target, "rt") as f:  # the whole stream, checksum included
        lines = f.read().splitlines()
    assert lines.count("ITEM: TIMESTEP") == 3 and len(lines) == 3 * (9 + 108)
    assert not (tmp_path / "r.npz").exists() and leftovers(tmp_path) == []


def test_dump_writer_discard_keeps_the_previous_file(tmp_path):
    target = tmp_path / "t.xyz"
    target.write_text("previous")
    writer = DumpWriter(str(target))
    writer.discard()
    writer.close()  # nothing left to put in place
    assert target.read_text() == "previous" and leftovers(tmp_path) == []


@pytest.mark.parametrize("argv, needle", [
    (["--dt", "inf"], "--dt: must be a finite number"),
    (["--dt", "nan"], "--dt: must be a finite number"),
    (["--skin", "nan"], "--skin: must be a finite number"),
    (["--rc", "inf"], "--rc: must be a finite number"),
    (["--temp", "inf"], "--temp: must be a finite number"),
    (["--density", "nan"], "--density: must be a finite number"),
    (["--thermostat", "langevin", "--t-target", "inf"], "--t-target: must be a finite number"),
    (["--thermostat", "langevin", "--damp", "inf"], "--damp: must be a finite number"),
    (["--seed", "-1"], "--seed: must be in [0, 2**64)"),
    (["--seed", str(2 ** 64)], "--seed: must be in [0, 2**64)"),
])
def test_bad_options_exit_2(capsys, argv, needle):
    code, out, err = run_cli(capsys, *BASE, "--steps", "2", *argv)
    assert code == 2 and out == ""
    assert_one_line_error(err, needle)


def test_library_refuses_non_finite_parameters():
    from solvers.md import Langevin, LennardJones, VelocityVerlet, lattice_state
    with pytest.raises(InputError, match="finite"):
        VelocityVerlet(float("inf"))
    with pytest.raises(InputError, match="finite"):
        Langevin(0.005, t_target=1.0, damp=float("inf"), seed=1)
    with pytest.raises(InputError, match="finite"):
        LennardJones(rc=2.5).check_box(np.full(3, 10.0), float("nan"))
    with pytest.raises(InputError, match="--seed"):
        lattice_state(cells=(2, 2, 2), seed=-1)


def _write_dump(path, text, compress):
    if compress:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


@pytest.mark.parametrize("case, needle", [
    ("infinite bound", "box bounds must be finite"),
    ("flipped byte", "damaged or cut gzip file"),
    ("cut", "damaged or cut gzip file"),
])
def test_bad_dump_input(capsys, tmp_path, case, needle):
    path = tmp_path / "in.dump.gz"
    atoms = "".join(f"{i + 1} {i % 5 * 1.5} {i // 5 % 5 * 1.5} {i // 25 * 1.5}\n" for i in range(100))
    bounds = "0 inf\n0 7.5\n0 7.5" if case == "infinite bound" else "0 7.5\n0 7.5\n0 7.5"
    _write_dump(path, DUMP_HEAD.format(n=100, bounds=bounds) + atoms, compress=True)
    data = path.read_bytes()
    if case == "flipped byte":
        damaged = bytearray(data)
        damaged[len(data) // 2] ^= 0x55
        path.write_bytes(bytes(damaged))
    elif case == "cut":
        path.write_bytes(data[: len(data) // 2])
    code, out, err = run_cli(capsys, "--data", path, "--device", "cpu", "--steps", "1", "--rc", "1.2")
    assert code == 2 and out == ""
    assert_one_line_error(err, path, needle)


@pytest.fixture
def two_gib(monkeypatch):
    """The host has 2 GiB available, whatever this machine has."""
    monkeypatch.setattr(resources, "available_host_memory", lambda: 2 << 30)


def test_huge_lattice_is_refused_before_allocating(capsys, two_gib):
    code, out, err = run_cli(capsys, "--device", "cpu", "--steps", "1", "--cells", "1000", "1000", "1000")
    assert code == 2 and out == ""
    assert_one_line_error(err, "--cells", "a system of 4,000,000,000 atoms would need about",
                          "of memory, but only 2 GiB is available")


def test_huge_dump_is_refused_before_allocating(capsys, tmp_path, two_gib):
    path = tmp_path / "in.dump"
    _write_dump(path, DUMP_HEAD.format(n=1_000_000_000_000, bounds="0 30\n0 30\n0 30") + "1 1 1 1\n2 10 10 10\n",
                compress=False)
    code, _, err = run_cli(capsys, "--data", path, "--device", "cpu", "--steps", "1")
    assert code == 2
    assert_one_line_error(err, path, "a system of 1e+12 atoms would need about")


@pytest.mark.parametrize("n, edge", [(2, 3000.0), (32_000, 3175.0)])  # sparse atoms, or --density 1e-6
def test_gpu_cell_grid_of_a_sparse_system_is_counted(monkeypatch, n, edge):
    from solvers.md import memory
    asked = {}
    monkeypatch.setattr(memory, "require_device_memory", lambda nbytes, what, source: asked.update(gpu=nbytes))
    monkeypatch.setattr(memory, "require_host_memory", lambda nbytes, what, source: asked.update(host=nbytes))
    memory.require_run(n, np.full(3, edge), 2.8, "gpu", "in.dump")
    assert asked["gpu"] > 8 * (edge // 2.8) ** 3  # a count and a start for each of a billion cells
    memory.require_run(n, np.full(3, edge), 2.8, "cpu", "in.dump")
    assert asked["host"] < 1 << 30  # the k-d tree of the NumPy backend has no grid


def test_dump_read_back_after_atomic_write(tmp_path):
    assert main(BASE + ["--steps", "10", "--dump", str(tmp_path / "t.dump.gz"), "--dump-every", "5"]) == 0
    assert read_dump(str(tmp_path / "t.dump.gz")).n == 108
    assert stat.S_ISREG(os.stat(tmp_path / "t.dump.gz").st_mode) and leftovers(tmp_path) == []
