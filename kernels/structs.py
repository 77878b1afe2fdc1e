"""C structs shared by the host and the kernels, each defined once, here in Python.

A :class:`Struct` lists its fields with their C types. It gives the NumPy dtype
the host reads and fills (laid out by C's alignment rules, so the bytes match)
and the C definition the loader puts ahead of the kernel sources, with
``static_assert`` checks of every offset and of the size, so a layout can never
differ between the two sides. Kernels take their parameters as one such struct,
passed by value (a NumPy structured scalar, see :meth:`Struct.pack`).
"""
import struct

import numpy as np

_SCALARS = {"double": "f8", "float": "f4", "int": "i4", "unsigned int": "u4", "unsigned long long": "u8"}
_CODES = {"f8": "d", "f4": "f", "i4": "i", "u4": "I", "u8": "Q"}  # Python struct codes of _SCALARS' types


def address(value):
    """Device address of ``value`` for a pointer field: a CuPy array, a raw address, or None (null)."""
    if value is None:
        return 0
    data = getattr(value, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return int(data.ptr)
    return int(value)


class Struct:
    """A C struct with a NumPy twin.

    Parameters
    ----------
    name : str
        The C type name.
    fields : sequence of (str, str or Struct)
        Field names and C types in order: ``double``, ``float``, ``int``,
        ``unsigned int``, ``unsigned long long``, a fixed array of one of these
        (``double[3]``), any pointer (``const real_t*``; a 64-bit address on the
        host), or another :class:`Struct` (nested by value).
    """

    def __init__(self, name, fields):
        self.name = name
        self.fields = tuple(fields)
        self._hash = hash((name, self.fields))
        self.dtype = np.dtype([(f, self._numpy_type(t)) for f, t in self.fields], align=True)
        self._packer, self._slots = self._byte_layout()
        self._defaults = [bytes(self.dtype.fields[name][0].itemsize) if kind == "struct" else 0
                          for name, (_, count, kind) in self._slots.items() for _ in range(count)]

    def __eq__(self, other):
        """Equal when the C definitions are: a struct made again for another set-up (a kernel's parameters
        over the same ``Matrix``) finds the module compiled for the first (:func:`kernels.module`'s cache)."""
        return isinstance(other, Struct) and (self.name, self.fields) == (other.name, other.fields)

    def __hash__(self):
        return self._hash

    def _byte_layout(self):
        """A :class:`struct.Struct` writing the fields at the dtype's offsets (padding as pad bytes), and
        each field's ``(first argument, count, kind)``: :meth:`pack` fills a flat argument list with it
        (kind ``"ptr"``, ``"struct"`` or ``"value"``): 3.7 us for a struct of 16 fields where assigning the
        fields of a structured NumPy scalar one by one took 6.6 (a set-up packs a dozen)."""
        codes, slots, at, args = ["<"], {}, 0, 0
        for name, ctype in self.fields:
            field, offset = self.dtype.fields[name][:2]
            codes.append("x" * (offset - at))
            if isinstance(ctype, Struct):
                codes.append(f"{field.itemsize}s")
                slots[name] = (args, 1, "struct")
            else:
                base = field.subdtype[0] if field.subdtype else field
                count = field.itemsize // base.itemsize
                codes.append(_CODES[base.str[1:]] * count)
                slots[name] = (args, count, "ptr" if ctype.endswith("*") else "value")
            args += slots[name][1]
            at = offset + field.itemsize
        codes.append("x" * (self.dtype.itemsize - at))
        return struct.Struct("".join(codes)), slots

    @staticmethod
    def _numpy_type(ctype):
        if isinstance(ctype, Struct):
            return ctype.dtype
        if ctype.endswith("*"):
            return "u8"
        if ctype.endswith("]"):  # a fixed array, "double[3]"
            base, count = ctype[:-1].split("[")
            return (_SCALARS[base], (int(count),))
        return _SCALARS[ctype]

    @staticmethod
    def _declaration(name, ctype):
        if isinstance(ctype, Struct):
            return f"{ctype.name} {name};"
        if ctype.endswith("]"):
            base, count = ctype[:-1].split("[")
            return f"{base} {name}[{count}];"
        return f"{ctype} {name};"

    def nested(self):
        """The structs this one contains, innermost first (they must be defined before it)."""
        out = []
        for _, t in self.fields:
            if isinstance(t, Struct):
                out += [s for s in t.nested() + [t] if s not in out]
        return out

    def definition(self):
        """C text: the struct and the compile-time checks of its layout."""
        lines = [f"struct {self.name} {{"]
        lines += ["    " + self._declaration(f, t) for f, t in self.fields]
        lines.append("};")
        for f, _ in self.fields:  # with equal sizes and alignments, C's rules give equal offsets
            field = self.dtype.fields[f][0]
            lines.append(f"static_assert(sizeof({self.name}::{f}) == {field.itemsize} && "
                         f"alignof(decltype({self.name}::{f})) == {field.alignment}, "
                         f"\"{self.name}.{f}: host and device layouts differ\");")
        lines.append(f"static_assert(sizeof({self.name}) == {self.dtype.itemsize}, "
                     f"\"{self.name}: host and device sizes differ\");")
        return "\n".join(lines) + "\n"

    def pack(self, **values):
        """The struct's bytes as a NumPy structured scalar (what a kernel takes by value).

        Pointer fields take CuPy arrays, addresses or None; nested structs take the
        result of their own :meth:`pack`; unnamed fields are zero.
        """
        args = self._defaults.copy()
        slots = self._slots
        for key, value in values.items():
            slot = slots.get(key)
            if slot is None:
                raise KeyError(f"{self.name} has no field {key!r}")
            first, count, kind = slot
            if kind == "ptr":
                args[first] = address(value)
            elif kind == "struct":
                args[first] = value.tobytes()
            elif count > 1:
                args[first:first + count] = np.asarray(value).ravel().tolist()
            else:
                args[first] = value.item() if isinstance(value, np.generic) else value
        return np.frombuffer(self._packer.pack(*args), dtype=self.dtype)[0]

    def read(self, raw):
        """A device buffer's bytes (NumPy ``uint8``) as this struct (a structured scalar)."""
        return np.asarray(raw).view(self.dtype)[0]


def definitions(structs):
    """C text defining ``structs`` and everything they nest, each once, dependencies first."""
    order = []
    for s in structs:
        for t in s.nested() + [s]:
            if t not in order:
                order.append(t)
    return "".join(t.definition() for t in order)


# A block's sums in a grid reduction (kernels/grid.cu): two buffers of one slot a block.
SLOT = Struct("Slot", [("v", "double[3]")])

# PCG solver state (kernels/pcg.cu): one per solve, on the device; iteration -1 is the set-up pass.
# alpha_prev: the classic solvers' step before alpha while x has not taken it (the distributed solver
# marks a taken step 0); x_steps: how many of the latest steps (alpha, then alpha_prev) the one-GPU
# classic kernel's x has still to take, 0 to 2; rz_inv: 1 / rz, carried by the single-reduction decision.
STATE = Struct("State", [("rz", "double"), ("alpha", "double"), ("beta", "double"), ("tol", "double"),
                         ("rnorm", "double"), ("pq", "double"), ("alpha_prev", "double"), ("rz_inv", "double"),
                         ("iteration", "int"), ("maxiter", "int"), ("status", "int"), ("parity", "int"),
                         ("ticket", "unsigned int"), ("x_steps", "int")])

# Written by the deciding thread into host-mapped memory, so the host can watch a running graph.
PROGRESS = Struct("Progress", [("rnorm", "double"), ("iteration", "int"), ("status", "int")])
