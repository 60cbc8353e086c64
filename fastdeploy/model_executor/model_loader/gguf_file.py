"""A GGUF file opened without reading its metadata into Python objects.

Layout (ggml's docs/gguf.md, versions 2 and 3, little-endian): magic "GGUF", uint32 version, uint64
tensor_count, uint64 kv_count; kv_count (key, value type, value) entries; tensor_count tensor infos
(name, uint32 n_dims, n_dims uint64 dims, uint32 ggml type, uint64 offset); padding to
`general.alignment` (default 32); the tensor data, each tensor at its offset from there. Strings are
a uint64 byte length then UTF-8 bytes; an array is a uint32 element type, a uint64 count, then the
elements.

Opening walks the header once and keeps, per key, only where its value starts; a value becomes a
Python object when asked for (`value`). gguf-py's `GGUFReader` instead builds a numpy view per array
element (two per string), ~10^5 objects for a tokenizer's tokens and merges, whose burst fragments
the Python heap of a long-running process. gguf-py still gives the tensor types
(`GGMLQuantizationType`, `GGML_QUANT_SIZES`) and the dequantization.

The tensor data is a read-only memory map of the file. A mapped page that was read counts in the
process's RSS for as long as it stays mapped, so a loader that copies every tensor into the model
would end with the file's size twice in RSS; `release(tensor)` drops a copied tensor's pages from the
process (the data stays readable: a later read pages it in again from the file).
"""
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# GGUF value types (gguf.md `gguf_metadata_value_type`)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR_DTYPES = {
    UINT8: np.dtype("<u1"), INT8: np.dtype("<i1"), UINT16: np.dtype("<u2"), INT16: np.dtype("<i2"),
    UINT32: np.dtype("<u4"), INT32: np.dtype("<i4"), FLOAT32: np.dtype("<f4"), BOOL: np.dtype("?"),
    UINT64: np.dtype("<u8"), INT64: np.dtype("<i8"), FLOAT64: np.dtype("<f8"),
}
# tensor types whose data gguf-py shows as numbers (the others: bytes, [..., row bytes] uint8)
_PLAIN_TENSOR_DTYPES = {
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass
class GGUFTensor:
    """One entry of the tensor table.

    shape: GGUF order, fastest dimension first (ne0 = row length), as in the file.
    data: a read-only view of the file, shaped as gguf-py's `ReaderTensor.data`: numbers
        [ne_{n-1}, ..., ne0] for F32/F16/F64/I8-I64, else uint8 [ne_{n-1}, ..., ne0 row bytes].
    """

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


class _Cursor:
    """Reads little-endian values from `buf` at `pos`, raising ValueError past its end."""

    def __init__(self, path: Path, buf: memoryview):
        self.path, self.buf, self.pos = path, buf, 0

    def need(self, size: int, what: str) -> int:
        """Start of the next `size` bytes (and moves past them)."""
        start = self.pos
        if size < 0 or start + size > len(self.buf):
            raise ValueError(f"GGUF file {self.path} is truncated: {what} at byte {start} needs {size} bytes, "
                             f"the file has {len(self.buf)}")
        self.pos += size
        return start

    def unpack(self, fmt: str, what: str):
        return struct.unpack_from(fmt, self.buf, self.need(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        size = self.unpack("<Q", what)
        start = self.need(size, what)
        try:
            return str(self.buf[start:start + size], "utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"GGUF file {self.path}: {what} at byte {start} is not UTF-8 ({error})") from None

    def skip_value(self, kind: int, what: str) -> None:
        """Move past one value of `kind` without building it."""
        if kind in _SCALAR_DTYPES:
            self.need(_SCALAR_DTYPES[kind].itemsize, what)
        elif kind == STRING:
            self.need(self.unpack("<Q", what), what)
        elif kind == ARRAY:
            element, count = self.unpack("<I", what), self.unpack("<Q", what)
            if element in _SCALAR_DTYPES:
                self.need(count * _SCALAR_DTYPES[element].itemsize, what)
            else:
                for _ in range(count):
                    self.skip_value(_known_type(self.path, element, what), what)
        else:
            raise ValueError(f"GGUF file {self.path}: {what} has value type {kind}; known: 0 to 12")

    def read_value(self, kind: int, what: str) -> Any:
        """One value of `kind`: a Python scalar, a str, a 1-D numpy array of numbers, or a list."""
        if kind in _SCALAR_DTYPES:
            dtype = _SCALAR_DTYPES[kind]
            return np.frombuffer(self.buf, dtype, 1, self.need(dtype.itemsize, what)).item()
        if kind == STRING:
            return self.string(what)
        if kind != ARRAY:
            raise ValueError(f"GGUF file {self.path}: {what} has value type {kind}; known: 0 to 12")
        element, count = self.unpack("<I", what), self.unpack("<Q", what)
        if element in _SCALAR_DTYPES:
            dtype = _SCALAR_DTYPES[element]
            return np.frombuffer(self.buf, dtype, count, self.need(count * dtype.itemsize, what))
        element = _known_type(self.path, element, what)
        return [self.read_value(element, what) for _ in range(count)]


def _known_type(path: Path, kind: int, what: str) -> int:
    if not 0 <= kind <= FLOAT64:
        raise ValueError(f"GGUF file {path}: {what} has array element type {kind}; known: 0 to 12")
    return kind


class GGUFFile:
    """An open GGUF file: its metadata by key (read on request) and its tensor table.

    Raises ValueError naming the file for a bad magic, a version other than 2 or 3 (or a
    big-endian file), a truncated header or tensor, an unknown value or tensor type, a duplicate key
    or tensor name, or an alignment that is not a power of two.
    """

    def __init__(self, path):
        self.path = Path(path)
        size = self.path.stat().st_size
        # np.memmap cannot map an empty file; such a file is reported as truncated below
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)
        cursor = _Cursor(self.path, memoryview(self._map))
        magic = bytes(cursor.buf[cursor.need(4, "the magic"):4])
        if magic != MAGIC:
            raise ValueError(f"{self.path} is not a GGUF file: it starts with {magic!r}, not {MAGIC!r}")
        self.version = cursor.unpack("<I", "the version")
        if self.version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(self.version.to_bytes(4, "little"), "big")
            kind = " (a big-endian file)" if swapped in SUPPORTED_VERSIONS else ""
            raise ValueError(f"GGUF file {self.path} has version {self.version}{kind}; "
                             f"supported: little-endian versions {SUPPORTED_VERSIONS}")
        tensor_count = cursor.unpack("<Q", "the tensor count")
        kv_count = cursor.unpack("<Q", "the key/value count")
        self._values: dict[str, tuple[int, int]] = {}  # key -> (value type, where its value starts)
        for index in range(kv_count):
            key = cursor.string(f"key {index}")
            if key in self._values:
                raise ValueError(f"GGUF file {self.path} repeats the key {key!r}")
            kind = cursor.unpack("<I", f"the value type of {key!r}")
            self._values[key] = (kind, cursor.pos)
            cursor.skip_value(kind, f"the value of {key!r}")
        infos = [self._tensor_info(cursor, index) for index in range(tensor_count)]
        names = set()
        for name, *_ in infos:
            if name in names:
                raise ValueError(f"GGUF file {self.path} repeats the tensor name {name!r}")
            names.add(name)
        alignment = self.value("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"GGUF file {self.path}: general.alignment is {alignment!r}; "
                             "it must be a positive power of two")
        data_start = -(-cursor.pos // alignment) * alignment
        self.tensors = [self._tensor(cursor, data_start, *info) for info in infos]

    def release(self, tensor: GGUFTensor) -> None:
        """Drop this process's mapped pages of `tensor`'s data (madvise MADV_DONTNEED over the pages it
        spans, a neighbour's shared edge page included), after its values were copied out; RSS falls by
        its size. Nothing is lost: `tensor.data` stays valid and reading it again pages it in from the
        file. ValueError if `tensor` is not one of this file's."""
        start = tensor.data.__array_interface__["data"][0] - self._map.__array_interface__["data"][0]
        if not 0 <= start <= start + tensor.data.nbytes <= self._map.nbytes:
            raise ValueError(f"tensor {tensor.name!r} is not in GGUF file {self.path}")
        if tensor.data.nbytes == 0:
            return
        first = start - start % mmap.PAGESIZE
        last = -(-(start + tensor.data.nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE
        self._map._mmap.madvise(mmap.MADV_DONTNEED, first, min(last, self._map.nbytes) - first)

    def keys(self) -> list[str]:
        """The metadata keys, in file order."""
        return list(self._values)

    def value(self, key: str, default: Any = None) -> Any:
        """The value of metadata field `key`, or `default` if the file has no such key.

        Numbers become int/float (float32 widened to float), booleans bool, strings str; an array
        of numbers or booleans is one read-only 1-D numpy array viewing the file, an array of strings
        a list of str, an array of arrays a list of those.
        """
        if key not in self._values:
            return default
        kind, start = self._values[key]
        cursor = _Cursor(self.path, memoryview(self._map))
        cursor.pos = start
        return cursor.read_value(kind, f"the value of {key!r}")

    def array_length(self, key: str) -> int:
        """Element count of the array field `key` (without reading its elements); KeyError if absent,
        ValueError if it is not an array."""
        kind, start = self._values[key]
        if kind != ARRAY:
            raise ValueError(f"GGUF file {self.path}: {key!r} has value type {kind}, not an array ({ARRAY})")
        return struct.unpack_from("<Q", self._map, start + 4)[0]

    def _tensor_info(self, cursor: _Cursor, index: int) -> tuple[str, tuple[int, ...], int, int]:
        name = cursor.string(f"the name of tensor {index}")
        n_dims = cursor.unpack("<I", f"the dimension count of tensor {name!r}")
        dims = struct.unpack_from(f"<{n_dims}Q", cursor.buf, cursor.need(8 * n_dims, f"the shape of tensor {name!r}"))
        kind = cursor.unpack("<I", f"the type of tensor {name!r}")
        offset = cursor.unpack("<Q", f"the offset of tensor {name!r}")
        return name, dims, kind, offset

    def _tensor(self, cursor: _Cursor, data_start: int, name: str, dims: tuple[int, ...], kind: int,
                offset: int) -> GGUFTensor:
        try:
            tensor_type = GGMLQuantizationType(kind)
        except ValueError:
            raise ValueError(
                f"GGUF file {self.path}: tensor {name!r} has ggml type {kind}, unknown to gguf-py") from None
        shape = tuple(reversed(dims))  # numpy order, slowest dimension first
        if tensor_type in _PLAIN_TENSOR_DTYPES:
            dtype = np.dtype(_PLAIN_TENSOR_DTYPES[tensor_type])
        else:
            dtype = np.dtype(np.uint8)
            if not shape or shape[-1] % GGML_QUANT_SIZES[tensor_type][0]:
                raise ValueError(f"GGUF file {self.path}: tensor {name!r} of type {tensor_type.name} has shape "
                                 f"{dims}, whose rows are not whole blocks of {GGML_QUANT_SIZES[tensor_type][0]}")
            shape = quant_shape_to_byte_shape(shape, tensor_type)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        cursor.pos = data_start + offset
        start = cursor.need(nbytes, f"the data of tensor {name!r}")
        return GGUFTensor(name, tensor_type, tuple(int(d) for d in dims),
                          self._map[start:start + nbytes].view(dtype).reshape(shape))
