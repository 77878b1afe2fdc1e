"""The parameter structs of ``md.cu``, defined once here for both sides.

Every MD kernel takes one ``MdParams`` (by value: it lands in the kernel's
constant parameter bank). :func:`c_source` writes the C definitions the loader
puts ahead of ``md.cu``; :func:`dtype` gives the NumPy structured dtype of the
same layout (``align=True`` pads as a C compiler does), and :func:`pack` fills
one, so the host never lists arguments by position.

Field types: ``real`` (the kernels' ``real_t``), ``int``, ``uint``, ``double``,
``u64``, a pointer (ends in ``*``: a device address) or another struct here.
The pair-potential parameters are a struct per potential; ``MdParams.pair`` has
the type of the potential a module is compiled for (``md.cu``'s functor of the
same name reads it).
"""
import numpy as np

STRUCTS = {
    "Box": (("lx", "real"), ("ly", "real"), ("lz", "real")),
    # nx*ny*nz cells of capacity cap; s* = cells per unit length.
    "Cells": (("nx", "int"), ("ny", "int"), ("nz", "int"), ("cap", "int"), ("sx", "real"), ("sy", "real"),
              ("sz", "real")),
    # Langevin: gamma_m = m / damp, noise = sqrt(24 kT m / (damp dt)), Philox key (seed_lo, seed_hi).
    "Bath": (("on", "int"), ("gamma_m", "double"), ("noise", "double"), ("seed_lo", "uint"), ("seed_hi", "uint")),
    "PairLJParams": (("rc_sq", "real"), ("sigma_sq", "real"), ("eps4", "real"), ("eps24", "real"),
                     ("eshift", "double")),
    "PairMorseParams": (("rc_sq", "real"), ("d0", "real"), ("alpha", "real"), ("r0", "real"), ("eshift", "double")),
}

# Buffers (see md.cu and solvers/md/gpu.py), then sizes and scalars.
MD_PARAMS = (
    ("pos", "vec4*"), ("pos_alt", "vec4*"), ("vel", "vec4*"), ("frc", "vec4*"), ("img", "int4*"),
    ("hold", "vec4*"), ("pe", "double*"), ("vir", "double*"), ("partial", "double*"), ("thermo", "double*"),
    ("nlist", "int*"), ("ncount", "int*"), ("order", "int*"), ("ids", "const long long*"), ("ctl", "u64*"),
    ("cell_count", "int*"), ("cell_atoms", "int*"), ("cell_sorted", "int*"), ("cell_pos", "vec4*"),
    ("cell_start", "int*"),
    ("n", "int"),          # particles integrated, listed and forced (a rank's own)
    ("n_local", "int"),    # particles binned: the n own, then ghost copies (n_local == n on one GPU)
    ("tpp", "int"), ("by_cell", "int"), ("ncells", "int"), ("maxnb", "int"),
    ("count", "int"),      # md_run: steps a launch at most
    ("dt", "real"), ("half_dt_m", "real"), ("trigger_sq", "real"), ("max_move_sq", "real"), ("rlist_sq", "real"),
    ("mass", "double"),
    ("box", "Box"), ("cells", "Cells"), ("bath", "Bath"), ("pair", "PAIR"),
)
PAIRS = {"PairLJ": "PairLJParams", "PairMorse": "PairMorseParams"}

_C = {"real": "real_t", "int": "int", "uint": "unsigned", "double": "double", "u64": "unsigned long long"}
_NP = {"int": np.int32, "uint": np.uint32, "double": np.float64, "u64": np.uint64}


def _fields(name, pair):
    return MD_PARAMS if name == "MdParams" else STRUCTS[name]


def _resolve(kind, pair):
    return PAIRS[pair] if kind == "PAIR" else kind


def c_source(pair):
    """C definitions of every struct, with ``MdParams.pair`` of the functor ``pair``'s parameters."""
    lines = ["struct vec4;  // defined in md.cu; the structs hold pointers to it", "typedef unsigned long long u64;"]
    for name in (*STRUCTS, "MdParams"):
        lines.append(f"struct {name} {{")
        for field, kind in _fields(name, pair):
            kind = _resolve(kind, pair)
            if kind.endswith("*"):
                lines.append(f"    {kind} {field};")
            else:
                lines.append(f"    {_C.get(kind, kind)} {field};")
        lines.append("};")
    return "\n".join(lines) + "\n"


def dtype(real, pair, name="MdParams"):
    """NumPy dtype laid out as the C struct ``name`` (``real``: float32 or float64)."""
    parts = []
    for field, kind in _fields(name, pair):
        kind = _resolve(kind, pair)
        if kind.endswith("*"):
            parts.append((field, np.uint64))
        elif kind == "real":
            parts.append((field, real))
        elif kind in _NP:
            parts.append((field, _NP[kind]))
        else:
            parts.append((field, dtype(real, pair, kind)))
    return np.dtype(parts, align=True)


def pack(real, pair, values):
    """One ``MdParams``: a one-element NumPy array of :func:`dtype`, which CuPy passes to a kernel by value.

    ``values`` maps field names to numbers, device addresses (ints) or, for a
    nested struct, a dict of its fields; every field must be given.
    """
    out = np.zeros(1, dtype(real, pair))

    def fill(target, vals):
        missing = set(target.dtype.names) - set(vals)
        if missing:
            raise KeyError(f"missing parameters: {', '.join(sorted(missing))}")
        for key in target.dtype.names:
            if target.dtype[key].names:
                fill(target[key], vals[key])
            else:
                target[key] = vals[key]

    fill(out, values)
    return out


def layout_check_source(real, pair):
    """A host C++ program printing ``sizeof`` and every field's ``offsetof`` of ``MdParams`` (nvcc compiles it).

    Its output, one ``path offset`` line per field and ``sizeof size`` last, is what
    :func:`dtype` must reproduce; tests compare the two.
    """
    lines = ["#include <cstdio>", "#include <cstddef>", "#include <vector_types.h>", f"typedef {real} real_t;",
             c_source(pair), "struct vec4 { real_t x, y, z, w; };", "int main() {"]

    def walk(name, prefix):
        for field, kind in _fields(name, pair):
            kind = _resolve(kind, pair)
            path = f"{prefix}{field}"
            lines.append(f'    std::printf("{path} %zu\\n", (size_t)offsetof(MdParams, {path}));')
            if kind in STRUCTS:
                walk(kind, path + ".")

    walk("MdParams", "")
    lines += ['    std::printf("sizeof %zu\\n", sizeof(MdParams));', "    return 0;", "}"]
    return "\n".join(lines) + "\n"


def layout(real, pair):
    """``{path: offset}`` of every field of :func:`dtype` (nested fields as ``box.lx``), and ``sizeof``."""
    out = {}

    def walk(dt, prefix, base):
        for name in dt.names:
            sub, offset = dt.fields[name][:2]
            out[f"{prefix}{name}"] = base + offset
            if sub.names:
                walk(sub, f"{prefix}{name}.", base + offset)

    dt = dtype(real, pair)
    walk(dt, "", 0)
    out["sizeof"] = dt.itemsize
    return out
