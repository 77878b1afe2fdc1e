"""Thermodynamic output as LAMMPS defines it (lj units, ``thermo_style``)."""
import numpy as np

# LAMMPS column names; the first five are the default ``thermo_style one`` minus E_mol.
COLUMNS = ("Step", "Temp", "E_pair", "TotEng", "Press", "KinEng", "Volume")


class UnstableRunError(RuntimeError):
    """The run blew up: non-finite values, or particles moving implausibly far in one step."""


def thermo_row(step, n, volume, mv2, pe, virial):
    """One thermo row from the device/host sums.

    Parameters
    ----------
    step : int
    n : int
        Number of particles.
    volume : float
    mv2 : float
        ``sum m v^2`` (twice the kinetic energy).
    pe : float
        Total pair energy.
    virial : float
        ``sum over pairs r . F``.

    Returns
    -------
    dict
        Keys :data:`COLUMNS`; Temp uses 3N-3 degrees of freedom, E_pair,
        TotEng and KinEng are per atom, Press is the virial pressure
        ``(dof T + W) / (3 V)``.
    """
    dof = max(3 * n - 3, 1)
    row = {
        "Step": int(step),
        "Temp": mv2 / dof,
        "E_pair": pe / n,
        "TotEng": (pe + 0.5 * mv2) / n,
        "Press": (mv2 + virial) / (3.0 * volume),
        "KinEng": 0.5 * mv2 / n,
        "Volume": volume,
    }
    if not all(np.isfinite(v) for v in row.values()):
        raise UnstableRunError(f"step {step}: thermo values are not finite (the run blew up)")
    return row


def header():
    """The LAMMPS-style thermo header line."""
    # "Step" starts the line: log readers look for a line beginning with it.
    return " ".join(f"{c:>16}" if c != "Step" else f"{c:<10}" for c in COLUMNS)


def format_row(row):
    """A thermo line, 10 significant digits per value."""
    return " ".join(f"{row[c]:<10d}" if c == "Step" else f"{row[c]:>16.10g}" for c in COLUMNS)


def as_arrays(rows):
    """Thermo rows as one NumPy array per column."""
    return {c: np.array([r[c] for r in rows]) for c in COLUMNS}
