"""Trajectory dumps (extended XYZ, LAMMPS dump) and restart files.

Both are written whole or not at all (:class:`~solvers.outfiles.AtomicFile`):
a dump goes to a temporary file beside its path and replaces it when the run
ends (complete frames only, a ``.gz`` with its trailer); a failed write leaves
the previous file as it was. A restart file is validated completely before a
run continues from it, so a damaged or foreign file gives one line naming it
and the problem, never a traceback or a run from wrong data.
"""
import json
import math
import os
import zipfile
import zlib

import numpy as np

from .. import interrupts
from ..errors import InputError
from ..outfiles import AtomicFile, check_target
from ..resources import require_host_memory
from .state import State

RESTART_VERSION = 1
#: Per-particle arrays of a restart file, each (N, 3).
RESTART_ARRAYS = ("positions", "velocities", "images", "forces", "hold")
THERMOSTATS = ("none", "langevin")


class DumpWriter:
    """Append frames to an extended XYZ (``.xyz``, ``.extxyz``) or LAMMPS dump file.

    Extended XYZ is what ASE (``ase.io.read(..., index=":")``) and OVITO read:
    ``species`` names the element (reduced LJ units name none; ``Ar`` is the
    conventional choice), and velocities are written as ASE keeps them, momenta
    beside the masses, so ``atoms.get_velocities()`` returns them. Any other name
    gets a LAMMPS text dump (``id type x y z vx vy vz``). A trailing ``.gz``
    compresses either. The file appears at ``path`` when :meth:`close` is
    called; :meth:`discard` drops it, leaving ``path`` as it was.
    """

    def __init__(self, path, species="Ar"):
        if not species.isidentifier():
            raise InputError(f"species must be an element name, got {species!r}", "--species")
        self.path, self.species = path, species
        stem = path[:-3] if path.endswith(".gz") else path
        self.xyz = stem.endswith((".xyz", ".extxyz"))
        self._file = AtomicFile(path, "dump", text=True, compress=path.endswith(".gz"))
        self._f = self._file.stream

    def write(self, step, time, state):
        """Write one frame of ``state`` (a :class:`State`) at ``step`` / ``time``.

        A SIGINT or SIGTERM waits until the frame is complete.
        """
        try:
            with interrupts.deferred():
                self._write(step, time, state)
        except OSError as exc:
            error = self._file.error(exc)
            self.discard()
            raise error from None

    def _write(self, step, time, state):
        x = state.positions + state.origin
        data = np.column_stack([x, state.velocities])
        lx, ly, lz = (f"{b:.17g}" for b in state.box)
        if self.xyz:
            o = " ".join(f"{c:.17g}" for c in state.origin)
            self._f.write(f"{state.n}\n")
            self._f.write(f'Lattice="{lx} 0 0 0 {ly} 0 0 0 {lz}" Origin="{o}" '
                          f'Properties=species:S:1:pos:R:3:momenta:R:3:masses:R:1:id:I:1 Step={step} '
                          f'Time={time:.17g} pbc="T T T"\n')
            rows = np.column_stack([x, state.mass * state.velocities, np.full(state.n, state.mass), state.ids])
            np.savetxt(self._f, rows, fmt=[f"{self.species} %.17g"] + ["%.17g"] * 6 + ["%d"])
        else:
            lo, hi = state.origin, state.origin + state.box
            self._f.write(f"ITEM: TIMESTEP\n{step}\nITEM: NUMBER OF ATOMS\n{state.n}\nITEM: BOX BOUNDS pp pp pp\n")
            for k in range(3):
                self._f.write(f"{lo[k]:.16e} {hi[k]:.16e}\n")
            self._f.write("ITEM: ATOMS id type x y z vx vy vz\n")
            rows = np.column_stack([state.ids, np.ones(state.n), data])
            np.savetxt(self._f, rows, fmt=["%d", "%d"] + ["%.17g"] * 6)
        self._f.flush()

    def close(self):
        """Finish the file and put it in place (nothing once discarded)."""
        if self._file is not None:
            file, self._file = self._file, None
            file.commit()

    def discard(self):
        """Drop what was written; the file at ``path`` stays as it was."""
        if self._file is not None:
            file, self._file = self._file, None
            file.discard()


def write_lammps_data(path, state, title):
    """``state`` as a LAMMPS data file (``atom_style atomic``, one type), positions and velocities to
    the last bit (``repr``): what LAMMPS reads to run the same system (reference runs, benchmarks)."""
    lines = [title, "", f"{state.n} atoms", "1 atom types", ""]
    lines += [f"0 {float(state.box[k])!r} {'xyz'[k]}lo {'xyz'[k]}hi" for k in range(3)]
    lines += ["", "Atoms # atomic", ""]
    lines += [f"{int(i)} 1 {x!r} {y!r} {z!r}" for i, (x, y, z) in zip(state.ids, state.positions.tolist())]
    lines += ["", "Velocities", ""]
    lines += [f"{int(i)} {x!r} {y!r} {z!r}" for i, (x, y, z) in zip(state.ids, state.velocities.tolist())]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def check_restart_target(path):
    """Raise :class:`InputError` now when a restart file could not be written to ``path`` at the end."""
    check_target(path, "restart file")


def write_restart(path, state, arrays, meta):
    """Write everything a bit-for-bit continuation needs, atomically.

    Parameters
    ----------
    path : str
    state : State
        Box, ids, mass, step, origin.
    arrays : dict
        ``positions``, ``velocities``, ``images``, ``forces``, ``hold`` (host arrays
        in the run's precision).
    meta : dict
        Run parameters (JSON-serialisable).
    """
    meta = dict(meta, version=RESTART_VERSION, step=int(state.step), mass=float(state.mass))
    with AtomicFile(path, "restart file") as f:
        np.savez(f, box=state.box, origin=state.origin, ids=state.ids, meta=np.array(json.dumps(meta)), **arrays)


def _bad(problem, path):
    return InputError(f"not a usable graphsolve MD restart file: {problem}", path)


def _member_headers(archive, path):
    """``{name: (shape, dtype)}`` of the arrays in an ``.npz``, read without loading them."""
    headers = {}
    for info in archive.infolist():
        name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        with archive.open(info) as f:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            if version not in read:
                raise _bad(f"array {name!r} has .npy format version {version}", path)
            shape, _fortran, dtype = read[version](f)
        headers[name] = (shape, dtype)
    return headers


def _value(meta, key, path, kind):
    """``meta[key]``, which must be a ``kind`` ("number", "integer" or "flag")."""
    if key not in meta:
        raise _bad(f"it lacks the parameter {key!r}", path)
    value = meta[key]
    ok = {"flag": isinstance(value, bool),
          "integer": isinstance(value, int) and not isinstance(value, bool),
          "number": isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}[kind]
    if not ok:
        raise _bad(f"parameter {key!r} is {value!r}, not {'a finite number' if kind == 'number' else 'an ' + kind}",
                   path)
    return value


def _check_meta(meta, path):
    """The run parameters of a restart file: each present, of its type, and accepted by the physics."""
    from .forcefield import POTENTIALS, from_meta
    from .integrators import Langevin, VelocityVerlet
    from .simulation import PRECISIONS
    if not isinstance(meta, dict):
        raise _bad("its parameters are not a JSON object", path)
    if meta.get("version") != RESTART_VERSION:
        raise _bad(f"format version {meta.get('version')!r} (this program reads version {RESTART_VERSION})", path)
    potential = POTENTIALS.get(meta.get("potential", "lj"))
    if potential is None:
        raise _bad(f"unknown potential {meta.get('potential')!r} (known: {', '.join(POTENTIALS)})", path)
    for name, field in potential.__dataclass_fields__.items():
        _value(meta, name, path, "flag" if field.type in (bool, "bool") else "number")
    for key in ("mass", "skin", "dt"):
        _value(meta, key, path, "number")
    for key in ("step", "builds"):
        if _value(meta, key, path, "integer") < 0:
            raise _bad(f"parameter {key!r} = {meta[key]} is negative", path)
    if meta.get("precision") not in PRECISIONS:
        raise _bad(f"unknown precision {meta.get('precision')!r} (known: {', '.join(PRECISIONS)})", path)
    if meta.get("thermostat") not in THERMOSTATS:
        raise _bad(f"unknown thermostat {meta.get('thermostat')!r} (known: {', '.join(THERMOSTATS)})", path)
    try:  # the ranges: what the physics itself accepts
        from_meta(meta, path)
        if meta["thermostat"] == "langevin":
            for key, kind in (("t_target", "number"), ("damp", "number"), ("seed", "integer")):
                _value(meta, key, path, kind)
            Langevin(meta["dt"], meta["t_target"], meta["damp"], meta["seed"])
        else:
            VelocityVerlet(meta["dt"])
    except InputError as exc:
        raise _bad(exc.problem if exc.source == path else str(exc), path) from None
    if not meta["mass"] > 0:
        raise _bad(f"parameter 'mass' = {meta['mass']} is not positive", path)
    if meta["skin"] < 0:
        raise _bad(f"parameter 'skin' = {meta['skin']} is negative", path)


def _check_arrays(headers, path, precision):
    """Shapes and types of the stored arrays, consistent with one another and with the precision."""
    required = ("box", "origin", "ids", "meta") + RESTART_ARRAYS
    missing = [k for k in required if k not in headers]
    if missing:
        raise _bad(f"it lacks the array {missing[0]!r}", path)
    for key in ("box", "origin"):
        shape, dtype = headers[key]
        if shape != (3,) or dtype.kind != "f":
            raise _bad(f"{key!r} has shape {shape} and type {dtype}, expected 3 floats", path)
    ids_shape, ids_dtype = headers["ids"]
    if len(ids_shape) != 1 or ids_dtype.kind not in "iu" or ids_shape[0] < 1:
        raise _bad(f"'ids' has shape {ids_shape} and type {ids_dtype}, expected one integer per atom", path)
    n = ids_shape[0]
    real = np.dtype(np.float64 if precision == "double" else np.float32)
    for key in RESTART_ARRAYS:
        shape, dtype = headers[key]
        if shape != (n, 3):
            raise _bad(f"{key!r} has shape {shape} but the file holds {n} atom ids (expected ({n}, 3))", path)
        want_kind = "iu" if key == "images" else "f"
        if dtype.kind not in want_kind or (key != "images" and dtype != real):
            expected = "integers" if key == "images" else f"{real} ({precision} precision)"
            raise _bad(f"{key!r} holds {dtype}, expected {expected}", path)
    return n


def read_restart(path):
    """Read and validate a restart file.

    Returns
    -------
    (State, dict, dict)
        The state (float64 copies), the saved arrays as stored, and the run parameters.

    Raises
    ------
    InputError
        Naming ``path`` and the first problem found: not a restart file (empty,
        truncated, another format), missing or mistyped parameters, arrays of
        the wrong shape or type, non-finite values, repeated atom ids.
    """
    if not os.path.exists(path):
        raise InputError("no such file", path)
    if not os.path.isfile(path):
        raise InputError("is not a regular file", path)
    if os.path.getsize(path) == 0:
        raise InputError("empty file", path)
    if not zipfile.is_zipfile(path):
        raise _bad("not an .npz archive (written by --restart)", path)
    try:
        with zipfile.ZipFile(path) as archive:
            headers = _member_headers(archive, path)
        meta_shape, meta_dtype = headers.get("meta", (None, None))
        if meta_shape != () or meta_dtype is None or meta_dtype.kind != "U":
            raise _bad("it lacks its run parameters ('meta')", path)
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            _check_meta(meta, path)
            n = _check_arrays(headers, path, meta["precision"])
            require_host_memory(n * 300, f"a restart of {n:,} atoms", path)
            arrays = {k: z[k] for k in RESTART_ARRAYS}
            box, origin, ids = z["box"], z["origin"], z["ids"]
    except InputError:
        raise
    except (OSError, ValueError, EOFError, KeyError, NotImplementedError, zipfile.BadZipFile, zlib.error) as exc:
        text = str(exc).strip()
        raise _bad(f"damaged ({type(exc).__name__}: {text.splitlines()[0] if text else 'unreadable'})", path) from None
    for key in ("positions", "velocities", "forces", "hold"):
        if not np.isfinite(arrays[key]).all():
            raise _bad(f"{key!r} has NaN or Inf values", path)
    if not (np.isfinite(box).all() and (box > 0).all() and np.isfinite(origin).all()):
        raise _bad(f"box {box.tolist()} at origin {origin.tolist()} is not finite and positive", path)
    if np.unique(ids).size != n:
        raise _bad("atom ids repeat", path)
    try:
        state = State(arrays["positions"].astype(np.float64), arrays["velocities"].astype(np.float64), box,
                      ids=ids, mass=meta["mass"], images=arrays["images"], step=meta["step"], origin=origin)
    except InputError as exc:
        raise _bad(exc.problem, path) from None
    return state, arrays, meta
