"""The GGUF key/value reader against ``gguf.GGUFReader`` on files written by ``gguf.GGUFWriter``:
every value type, both byte orders, keys skipped; and a damaged file is one line naming it."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from mrv2_prof.text import TokenizerError
from mrv2_prof.text.gguf_metadata import read_gguf_metadata


def _write_every_type(path, big_endian: bool):
    endian = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo 日本 🤖")
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", -0.1)
    w.add_array("t.strs", ["", "a b", "Ġtoken", "\n"])
    w.add_array("t.ints", [3, 1, 4, 1, 5])
    w.add_array("t.floats", [0.5, -2.25])
    w.add_array("t.empty", [])
    # a tensor after the metadata: the reader must stop at the key section
    w.add_tensor("tok_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _reference(path) -> dict:
    reader = gguf.GGUFReader(str(path))
    out = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        value = field.contents()
        out[name] = [float(v) for v in value] if name == "t.floats" else value
    return out


@pytest.mark.parametrize("big_endian", [False, True])
def test_every_value_type_equals_gguf_reader(tmp_path, big_endian):
    path = _write_every_type(tmp_path / "all.gguf", big_endian)
    got = read_gguf_metadata(path, lambda key: True)
    want = _reference(path)
    assert set(got) == set(want) and "t.strs" in got
    for key, value in want.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value), key
        else:
            assert got[key] == value, key


def test_skipped_keys_are_not_returned(tmp_path):
    path = _write_every_type(tmp_path / "all.gguf", big_endian=False)
    got = read_gguf_metadata(path, lambda key: key in ("t.u64", "t.ints"))
    assert got == {"t.u64": 2**63 + 5, "t.ints": [3, 1, 4, 1, 5]}


def test_a_truncated_file_is_one_line(tmp_path):
    path = _write_every_type(tmp_path / "all.gguf", big_endian=False)
    data = path.read_bytes()
    cut = data.index(b"t.strs") + 20  # inside the string array
    (tmp_path / "cut.gguf").write_bytes(data[:cut])
    with pytest.raises(TokenizerError) as err:
        read_gguf_metadata(tmp_path / "cut.gguf", lambda key: True)
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / "cut.gguf") in message
    assert "ends inside its metadata" in message and "t.strs" in message


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "cannot read"),
        (b"PK\x03\x04 not a gguf", "not a GGUF file"),
        (b"GGUF\x01\x00\x00\x00" + bytes(16), "version 1"),
    ],
)
def test_not_a_gguf_is_one_line(tmp_path, data, why):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(TokenizerError) as err:
        read_gguf_metadata(path, lambda key: True)
    assert "\n" not in str(err.value) and str(path) in str(err.value) and why in str(err.value)
