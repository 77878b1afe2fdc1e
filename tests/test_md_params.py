"""The MD kernels' parameter struct: the NumPy layout the host packs matches the C layout nvcc gives."""
import shutil
import subprocess

import numpy as np
import pytest

from solvers.kernels import md_params


@pytest.mark.parametrize("real", ["float", "double"])
@pytest.mark.parametrize("pair", sorted(md_params.PAIRS))
def test_numpy_layout_is_the_c_layout(tmp_path, real, pair):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed")
    src = tmp_path / "layout.cu"
    src.write_text(md_params.layout_check_source(real, pair))
    subprocess.run([nvcc, "-std=c++17", "-o", str(tmp_path / "layout"), str(src)], check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / "layout")], check=True, capture_output=True, text=True).stdout
    c_layout = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
    assert c_layout == md_params.layout(np.float32 if real == "float" else np.float64, pair)


def test_pack_needs_every_field():
    values = {name: 0 for name, _ in md_params.MD_PARAMS}
    values.update(box={"lx": 1, "ly": 2, "lz": 3}, cells={k: 1 for k, _ in md_params.STRUCTS["Cells"]},
                  bath={k: 0 for k, _ in md_params.STRUCTS["Bath"]},
                  pair={k: 1.5 for k, _ in md_params.STRUCTS["PairLJParams"]})
    packed = md_params.pack(np.float32, "PairLJ", values)
    assert packed.shape == (1,) and packed["box"]["ly"][0] == 2 and packed["pair"]["eps4"][0] == 1.5
    del values["maxnb"]
    with pytest.raises(KeyError, match="maxnb"):
        md_params.pack(np.float32, "PairLJ", values)
