"""Kernel argument structs (kernels/structs.py): packed bytes equal NumPy's own layout of the fields; equal structs
fetch one compiled module."""
import numpy as np
import pytest

from solvers.kernels.structs import Struct

INNER = Struct("Inner", [("v", "double[3]"), ("k", "int")])
OUTER = Struct("Outer", [("n", "int"), ("x", "double"), ("p", "const double*"), ("inner", INNER), ("f", "float"),
                         ("u", "unsigned int"), ("w", "unsigned long long"), ("a", "int[4]")])


def by_assignment(struct, **values):
    """The reference: a zeroed structured scalar, field by field."""
    record = np.zeros((), dtype=struct.dtype)
    for key, value in values.items():
        record[key] = value
    return record


def test_packed_bytes_equal_numpys_field_by_field():
    inner = INNER.pack(v=(1.5, -2.0, 3.25), k=np.int32(-7))
    got = OUTER.pack(n=5, x=np.float64(0.1), p=0xDEAD0000BEEF, inner=inner, f=2.5, u=4_000_000_000,
                     w=2**63 + 5, a=np.array([1, -2, 3, -4]))
    want = by_assignment(OUTER, n=5, x=0.1, p=0xDEAD0000BEEF, inner=by_assignment(INNER, v=(1.5, -2.0, 3.25), k=-7),
                         f=2.5, u=4_000_000_000, w=2**63 + 5, a=[1, -2, 3, -4])
    assert got.dtype == OUTER.dtype and got.tobytes() == want.tobytes()


def test_unnamed_fields_are_zero_and_null_pointers_are_zero():
    got = OUTER.pack(n=1, p=None)
    assert got.tobytes() == by_assignment(OUTER, n=1).tobytes()


def test_an_unknown_field_is_refused():
    with pytest.raises(KeyError, match="Outer has no field 'q'"):
        OUTER.pack(q=1)


def test_structs_made_again_are_equal_and_hash_alike():
    again = Struct("Outer", list(OUTER.fields))
    assert again == OUTER and hash(again) == hash(OUTER) and len({again, OUTER}) == 1
    assert Struct("Inner", [("v", "double[3]"), ("k", "unsigned int")]) != INNER
    assert Struct("Other", list(INNER.fields)) != INNER


def test_a_program_made_again_from_equal_structs_is_fetched_not_built(monkeypatch):
    from solvers import kernels
    built = []
    monkeypatch.setattr(kernels, "_compiled", lambda code: built.append(code) or object())
    kernels._module.cache_clear()
    try:
        def made():  # new struct objects each time, as each set-up makes its kernel's parameters
            return dict(name="sort", structs=(Struct("Outer", list(OUTER.fields)),))
        first = kernels.module(**made())
        assert kernels.module(**made()) is first and len(built) == 1
        read = kernels.source
        monkeypatch.setattr(kernels, "source", lambda name: read(name) + "// altered\n")
        assert kernels.module(**made()) is not first and len(built) == 2 and built[1].endswith("// altered\n")
    finally:
        kernels._module.cache_clear()  # no stand-in left for later tests
