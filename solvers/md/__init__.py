"""Molecular dynamics (Lennard-Jones or Morse, NVE / Langevin) with every timestep in a CUDA graph.

>>> from solvers.md import Simulation, LennardJones, VelocityVerlet, lattice_state
>>> sim = Simulation(lattice_state(cells=(5, 5, 5)), LennardJones(rc=2.5), VelocityVerlet(0.005), device="cpu")
>>> _ = sim.run(10)
>>> sim.step
10
"""
from .forcefield import LennardJones, Morse
from .integrators import Langevin, VelocityVerlet
from .io import DumpWriter
from .simulation import PRECISIONS, Simulation
from .state import State, fcc_lattice, lattice_state, read_dump
from .thermo import COLUMNS, UnstableRunError

__all__ = ["Simulation", "State", "LennardJones", "Morse", "VelocityVerlet", "Langevin", "DumpWriter",
           "UnstableRunError", "PRECISIONS", "COLUMNS", "fcc_lattice", "lattice_state", "read_dump"]
