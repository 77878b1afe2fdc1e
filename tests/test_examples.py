"""Every example runs with --small and prints what it promises."""
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_example(name, *args):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / name), "--small", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def number_after(label, text):
    m = re.search(re.escape(label) + r"\s*([-+0-9.eE]+)", text)
    assert m, f"{label!r} not in output:\n{text}"
    return float(m.group(1))


def test_heat_implicit():
    out = run_example("heat_implicit.py")
    assert "ms per step" in out and "SciPy cg (CPU)" in out
    assert number_after("max error vs analytic solution:", out) < 5e-2
    assert number_after("max difference from SciPy:", out) < 1e-6


def test_variable_coefficients():
    out = run_example("variable_coefficients.py")
    assert number_after("worst true relative residual over all steps:", out) < 1e-8
    instantiations = int(number_after("graph instantiations:", out))
    device = re.search(r"device (\w+), mode (\w+)", out).groups()
    assert instantiations == (1 if device[1] in ("graph", "while") else 0), out


@pytest.mark.slow
def test_lj_liquid(tmp_path):
    png = tmp_path / "gr.png"
    out = run_example("lj_liquid.py", "--plot", str(png))
    assert abs(number_after("g(r) first peak: r =", out) - 1.09) < 0.05
    assert abs(number_after("g(r) first minimum: r =", out) - 1.54) < 0.1
    assert abs(number_after("energy drift", out)) < 1e-3
    assert png.stat().st_size > 1000
