"""The MD kernels' parameter struct, packed on the host (its C layout is checked by the generated
static_asserts, compiled in tests/test_kernels_compile.py)."""
import numpy as np
import pytest

from solvers.kernels import md_params
from solvers.md import LennardJones, Morse


def values(potential, real):
    out = {name: 0 for name, _ in md_params.params_struct(real, potential.functor).fields}
    out.update(n=5, maxnb=40, dt=0.005, box={"lx": 1.0, "ly": 2.0, "lz": 3.0},
               cells={"nx": 3, "ny": 3, "nz": 3, "cap": 8, "sx": 1.0, "sy": 1.0, "sz": 1.0},
               bath={"on": 1, "gamma_m": 2.0, "noise": 0.5, "seed_lo": 7, "seed_hi": 0},
               pair=potential.device_params(), pos=0x7F00_0000_1000)
    return out


@pytest.mark.parametrize("potential", [LennardJones(sigma=1.1, rc=2.5, shift=True), Morse(1.0, 6.0, 1.1)])
@pytest.mark.parametrize("real", ["double", "float"])
def test_pack_fills_every_field(potential, real):
    packed = md_params.pack(real, potential.functor, values(potential, real))
    assert packed.dtype == md_params.params_struct(real, potential.functor).dtype
    assert packed["n"] == 5 and packed["pos"] == 0x7F00_0000_1000 and packed["box"]["lz"] == 3.0
    assert packed["bath"]["seed_lo"] == 7
    expected = potential.device_params()
    for key, value in expected.items():
        assert packed["pair"][key] == pytest.approx(value, rel=1e-6)
    assert packed["dt"].dtype == (np.float64 if real == "double" else np.float32)


def test_pack_needs_every_field():
    v = values(LennardJones(), "float")
    del v["maxnb"]
    with pytest.raises(KeyError, match="maxnb"):
        md_params.pack("float", "PairLJ", v)


def test_every_potential_has_its_functor_parameters():
    for potential in (LennardJones(), Morse()):
        fields = {name for name, _ in md_params.potential_struct("double", potential.functor).fields}
        assert set(potential.device_params()) == fields
