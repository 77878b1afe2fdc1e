"""Trajectory dumps (extended XYZ, LAMMPS dump) and restart files."""
import gzip
import json
import os

import numpy as np

from ..errors import InputError
from .state import State

RESTART_VERSION = 1


class DumpWriter:
    """Append frames to an extended XYZ (``.xyz``, ``.extxyz``) or LAMMPS dump file.

    Extended XYZ is what ASE (``ase.io.read(..., index=":")``) and OVITO read:
    ``species`` names the element (reduced LJ units name none; ``Ar`` is the
    conventional choice), and velocities are written as ASE keeps them, momenta
    beside the masses, so ``atoms.get_velocities()`` returns them. Any other name
    gets a LAMMPS text dump (``id type x y z vx vy vz``). A trailing ``.gz``
    compresses either.
    """

    def __init__(self, path, species="Ar"):
        if not species.isidentifier():
            raise InputError(f"species must be an element name, got {species!r}", "--species")
        self.path, self.species = path, species
        stem = path[:-3] if path.endswith(".gz") else path
        self.xyz = stem.endswith((".xyz", ".extxyz"))
        try:
            self._f = gzip.open(path, "wt", encoding="utf-8") if path.endswith(".gz") else open(path, "w", encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write dump ({exc.strerror})", path) from None

    def write(self, step, time, state):
        """Write one frame of ``state`` (a :class:`State`) at ``step`` / ``time``."""
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
        """Close the file."""
        self._f.close()


def write_restart(path, state, arrays, meta):
    """Write everything a bit-for-bit continuation needs.

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
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, box=state.box, origin=state.origin, ids=state.ids,
                     meta=np.array(json.dumps(meta)), **arrays)
        os.replace(tmp, path)
    except OSError as exc:
        raise InputError(f"cannot write restart ({exc.strerror})", path) from None


def read_restart(path):
    """Read a restart file.

    Returns
    -------
    (State, dict, dict)
        The state (float64 copies), the saved arrays as stored, and the run parameters.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            arrays = {k: z[k] for k in ("positions", "velocities", "images", "forces", "hold")}
            box, origin, ids = z["box"], z["origin"], z["ids"]
    except FileNotFoundError:
        raise InputError("no such file", path) from None
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise InputError(f"not a graphsolve MD restart file ({str(exc).splitlines()[0]})", path) from None
    if meta.get("version") != RESTART_VERSION:
        raise InputError(f"restart version {meta.get('version')} is not supported", path)
    state = State(arrays["positions"].astype(np.float64), arrays["velocities"].astype(np.float64), box,
                  ids=ids, mass=meta["mass"], images=arrays["images"], step=meta["step"], origin=origin)
    return state, arrays, meta
