"""Particle state: positions, velocities, box; lattice builder and LAMMPS dump reader."""
import gzip
import math
import os
import zlib
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from .memory import require_state


@dataclass
class State:
    """Particles in an orthorhombic periodic box ``[origin, origin + box)``.

    Attributes
    ----------
    positions : ndarray, shape (N, 3)
        Wrapped into ``[0, box)`` (relative to ``origin``).
    velocities : ndarray, shape (N, 3)
    box : ndarray, shape (3,)
        Edge lengths.
    ids : ndarray of int64, shape (N,)
        Particle ids (they index the Langevin random stream).
    mass : float
        Mass of every particle (one type).
    images : ndarray of int64, shape (N, 3)
        Periodic image counts (unwrapped = positions + images * box).
    step : int
        Timestep the state belongs to.
    origin : ndarray, shape (3,)
        Lower box corner, kept for output files.
    """

    positions: np.ndarray
    velocities: np.ndarray
    box: np.ndarray
    ids: np.ndarray = None
    mass: float = 1.0
    images: np.ndarray = None
    step: int = 0
    origin: np.ndarray = field(default_factory=lambda: np.zeros(3))

    def __post_init__(self):
        self.positions = np.array(self.positions, dtype=np.float64).reshape(-1, 3)
        n = len(self.positions)
        self.velocities = np.array(self.velocities, dtype=np.float64).reshape(n, 3)
        self.box = np.array(self.box, dtype=np.float64).reshape(3)
        self.ids = np.arange(1, n + 1, dtype=np.int64) if self.ids is None else np.asarray(self.ids, np.int64)
        self.images = np.zeros((n, 3), np.int64) if self.images is None else np.asarray(self.images, np.int64)
        self.origin = np.array(self.origin, dtype=np.float64).reshape(3)
        if n == 0:
            raise InputError("the system has no particles")
        if not (np.all(self.box > 0) and np.isfinite(self.box).all() and np.isfinite(self.origin).all()):
            raise InputError(f"box edges must be finite and positive, got {self.box.tolist()} "
                             f"(origin {self.origin.tolist()})")
        if not (np.isfinite(self.positions).all() and np.isfinite(self.velocities).all()):
            raise InputError("positions and velocities must be finite")
        if not self.mass > 0:
            raise InputError(f"mass must be positive, got {self.mass}")
        shift = np.floor(self.positions / self.box)
        self.positions = self.positions - shift * self.box
        # x/L rounding can leave x - floor(x/L) L just outside [0, L): that point is 0.
        self.positions[(self.positions >= self.box) | (self.positions < 0)] = 0.0
        self.images = self.images + shift.astype(np.int64)

    @property
    def n(self):
        """Number of particles."""
        return len(self.positions)

    @property
    def volume(self):
        """Box volume."""
        return float(np.prod(self.box))

    def unwrapped(self):
        """Positions with image crossings undone."""
        return self.positions + self.images * self.box


def fcc_lattice(density, cells):
    """Particles on an fcc lattice (4 per cubic cell) at number density ``density``.

    Parameters
    ----------
    density : float
        Reduced number density (LAMMPS ``lattice fcc <density>`` in lj units).
    cells : sequence of 3 int
        Unit cells along x, y, z.

    Returns
    -------
    (positions, box)
    """
    cells = np.asarray(cells, dtype=np.int64)
    if not (np.isfinite(density) and density > 0) or cells.shape != (3,) or np.any(cells < 1):
        raise InputError(f"need a finite density > 0 and three cell counts >= 1, got {density}, {cells.tolist()}")
    a = (4.0 / density) ** (1.0 / 3.0)
    basis = np.array([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]])
    grid = np.stack(np.meshgrid(*(np.arange(c) for c in cells), indexing="ij"), -1).reshape(-1, 1, 3)
    return ((grid + basis) * a).reshape(-1, 3), cells * a


def thermal_velocities(n, temp, mass, seed):
    """Gaussian velocities with zero total momentum, scaled to ``temp`` exactly (3N-3 dof)."""
    if not (np.isfinite(temp) and temp >= 0):
        raise InputError(f"--temp must be finite and >= 0, got {temp}")
    if not 0 <= int(seed) < 2 ** 64:
        raise InputError(f"must be in [0, 2**64), got {seed}", "--seed")
    v = np.random.default_rng(seed).standard_normal((n, 3))
    v -= v.mean(axis=0)
    ke2 = mass * np.einsum("ij,ij->", v, v)
    dof = max(3 * n - 3, 1)
    return v * np.sqrt(temp * dof / ke2) if ke2 > 0 else v * 0.0


def lattice_state(density=0.8442, cells=(20, 20, 20), temp=1.44, seed=87287, mass=1.0):
    """An fcc crystal with thermal velocities (like LAMMPS ``bench/in.lj``)."""
    require_state(4 * math.prod(int(c) for c in cells), "--cells")
    pos, box = fcc_lattice(density, cells)
    return State(pos, thermal_velocities(len(pos), temp, mass, seed), box, mass=mass)


def _open_text(path):
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8")


def read_dump(path, mass=1.0):
    """Read the first frame of a LAMMPS text dump (gzip allowed).

    Columns ``id`` and ``x y z`` (or ``xu yu zu``, or scaled ``xs ys zs``) are
    required; ``vx vy vz`` are optional (zero otherwise). The box comes from
    ``BOX BOUNDS`` (orthorhombic, periodic). Particles are ordered by id.

    Raises
    ------
    InputError
        Naming ``path`` and the problem.
    """
    if not os.path.isfile(path):
        raise InputError("no such file", path)
    try:
        with _open_text(path) as f:
            lines = [f.readline() for _ in range(9)]
            items = {}
            i = 0
            while i < len(lines) and lines[i].startswith("ITEM:"):
                key = lines[i][5:].strip()
                if key.startswith("TIMESTEP"):
                    items["step"] = int(lines[i + 1].split()[0])
                    i += 2
                elif key.startswith("NUMBER OF ATOMS"):
                    items["n"] = int(lines[i + 1].split()[0])
                    i += 2
                elif key.startswith("BOX BOUNDS"):
                    flags = key.split()[2:]
                    if "xy" in flags or len(lines[i + 1].split()) != 2:
                        raise InputError("triclinic boxes are not supported", path)
                    if any(fl != "pp" for fl in flags):
                        raise InputError(f"box must be periodic in x, y, z (pp pp pp), got {' '.join(flags)}", path)
                    items["bounds"] = np.array([[float(t) for t in lines[i + k].split()[:2]] for k in (1, 2, 3)])
                    i += 4
                elif key.startswith("ATOMS"):
                    items["columns"] = key.split()[1:]
                    break
                else:
                    raise InputError(f"unexpected dump section 'ITEM: {key}'", path)
            missing = {"step", "n", "bounds", "columns"} - set(items)
            if missing:
                raise InputError(f"not a LAMMPS dump (missing {', '.join(sorted(missing))})", path)
            cols, n = items["columns"], items["n"]
            if n < 1:
                raise InputError("dump holds no atoms", path)
            if not np.isfinite(items["bounds"]).all():
                raise InputError(f"box bounds must be finite, got {items['bounds'].tolist()}", path)
            require_state(n, path)
            data = np.loadtxt(f, max_rows=n, ndmin=2)
            if isinstance(getattr(f, "buffer", None), gzip.GzipFile):
                # read on to the end: only there does the checksum catch a damaged stream
                while f.buffer.read(1 << 20):
                    pass
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise InputError(f"damaged or cut gzip file ({str(exc).splitlines()[0]})", path) from None
    except (ValueError, IndexError, UnicodeDecodeError, OSError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"cannot parse LAMMPS dump ({str(exc).splitlines()[0]})", path) from None
    if data.shape != (n, len(cols)):
        raise InputError(f"expected {n} atom lines with {len(cols)} columns, got {data.shape[0]}x{data.shape[1]}", path)
    lo, hi = items["bounds"][:, 0], items["bounds"][:, 1]
    box = hi - lo
    if np.any(box <= 0):
        raise InputError("box bounds must have hi > lo", path)

    def column(name):
        return data[:, cols.index(name)]

    if "id" not in cols:
        raise InputError("dump has no 'id' column", path)
    for names, scaled in ((("x", "y", "z"), False), (("xu", "yu", "zu"), False), (("xs", "ys", "zs"), True)):
        if all(c in cols for c in names):
            pos = np.stack([column(c) for c in names], axis=1)
            pos = pos * box if scaled else pos - lo
            break
    else:
        raise InputError("dump needs position columns x y z (or xu yu zu, xs ys zs)", path)
    vel = np.stack([column(c) for c in ("vx", "vy", "vz")], axis=1) if "vx" in cols else np.zeros_like(pos)
    ids = column("id").astype(np.int64)
    if len(np.unique(ids)) != n:
        raise InputError("atom ids are not unique", path)
    order = np.argsort(ids)
    try:
        return State(pos[order], vel[order], box, ids=ids[order], mass=mass, step=items["step"], origin=lo)
    except InputError as exc:
        raise InputError(exc.problem, path) from None
