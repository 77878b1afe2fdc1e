"""The MD kernels' parameter struct, packed on the host (its C layout is checked by the generated
static_asserts, compiled in tests/test_kernels_compile.py)."""
import numpy as np
import pytest

from solvers.kernels import md_params, md_ref
from solvers.md import LennardJones, Morse
from solvers.md.integrators import Langevin, VelocityVerlet


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


class _Address:
    def __init__(self, ptr, size=1):
        self.data = type("Memory", (), {"ptr": ptr})()
        self.size = size


@pytest.mark.parametrize("integrator", [VelocityVerlet(0.005), Langevin(0.005, t_target=1.5, damp=2.0, seed=2**40 + 9)])
@pytest.mark.parametrize("distributed", [False, True])
def test_backends_fill_every_field_through_one_function(integrator, distributed):
    # the one-GPU and the GPU-rank backends take their MdParams from param_values (kernels built on the GPU)
    from types import SimpleNamespace

    from solvers.md.gpu import _BUFFERS, param_values
    names = (*_BUFFERS, "v", "f", "img")
    backend = SimpleNamespace(integ=integrator, mass=1.0, n=100, tpp=4, maxnb=60, rlist=2.8, cellcap=16,
                              ncell=np.array([4, 5, 6]), ff=LennardJones(), cell_count=_Address(0x1000, 120),
                              **{name: _Address(0x2000 + 0x100 * k) for k, name in enumerate(names)
                                 if name != "cell_count"})
    box = (1e30,) * 3 if distributed else np.array([8.0, 10.0, 12.0])
    values = param_values(backend, pos=_Address(0x9000), pos_alt=_Address(0x9100), n_local=130 if distributed else 100,
                          by_cell=not distributed, count=1 if distributed else 32, skin=0.3, box=box,
                          extent=np.array([8.0, 10.0, 12.0]))
    packed = md_params.pack("double", "PairLJ", values)
    assert packed["n_local"] == (130 if distributed else 100) and packed["pos"] == 0x9000
    assert packed["box"]["lx"] == box[0] and packed["cells"]["sz"] == pytest.approx(0.5)
    assert packed["trigger_sq"] == pytest.approx(0.0225) and packed["ncells"] == 120
    assert packed["bath"]["on"] == integrator.langevin
    if integrator.langevin:
        assert packed["bath"]["seed_hi"] == 256 and packed["bath"]["seed_lo"] == 9
        assert packed["bath"]["gamma_m"] == pytest.approx(0.5)


@pytest.mark.parametrize("tpp", [1, 2, 4, 8, 16, 32])
def test_neighbour_list_entries_hold_every_slot(tpp):
    """The list's allocation covers every slot the kernels write: a capacity that is not a multiple
    of the lanes a particle still gets whole runs of slots (a capacity of 78 at 4 lanes takes 80 a particle)."""
    rows = 7
    for maxnb in range(1, 70):
        g, s = np.meshgrid(np.arange(rows), np.arange(maxnb), indexing="ij")
        where = md_ref.neighbour_slot(g, s, rows, tpp)
        entries = md_params.neighbour_list_entries(maxnb, rows, tpp)
        assert where.max() < entries <= rows * (maxnb + tpp - 1)
        assert np.unique(where).size == where.size  # no two slots share an entry
