"""The safetensors file format, read and written from scratch with NumPy.

A file is an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to its
dtype, shape and [begin, end) byte offsets, then one flat data buffer: nothing executable. Every
header field is checked before a byte of data is read. Tensors come back as float32: F32 mapped
read-only where they lie, F16 and BF16 decoded once (docs/loading.md).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import reprlib
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import CheckpointError, unique_keys
from .files import is_file

# Bytes per element of every dtype the format defines with a whole-byte size.
ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
# The float dtypes minigpt decodes, and the NumPy dtype their bytes are read as.
STORAGE = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
# write_safetensors' dtype argument -> the header's dtype name.
ENCODINGS = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
MAX_HEADER_BYTES = 100 * 2**20  # the official reader's limit; GPT-2 xl's header is ~60 KB


@dataclass(frozen=True)
class TensorInfo:
    """One header entry, validated: where the tensor's bytes are in the file and what they mean."""

    dtype: str  # the format's name: "F32", "F16", "BF16", "I64", ...
    shape: tuple[int, ...]
    offset: int  # of the first byte, from the start of the file
    nbytes: int


def read_header(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """Every tensor's name, dtype, shape and position, without reading any tensor data."""
    with _open(path) as f:
        return _parse_header(f, Path(path))


def read_safetensors(path: str | os.PathLike, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """name -> float32 C-contiguous array for `names` (all tensors if None); reads no other data.
    F32 tensors are read-only views of the file mapped (no byte copied; a file renamed over it
    leaves them on the old bytes); F16 and BF16 ones are decoded into fresh arrays."""
    path = Path(path)
    with _open(path) as f:
        header = _parse_header(f, path)
        wanted = {name: _float_tensor(path, name, header.get(name)) for name in (header if names is None else names)}
        data = _map(f, path) if any(info.nbytes for info in wanted.values()) else b""
        return {name: _decode(data, path, name, info) for name, info in wanted.items()}


def write_safetensors(
    path: str | os.PathLike,
    tensors: Mapping[str, np.ndarray],
    dtype: str = "float32",
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Store `tensors` as `dtype` (float32, float16 or bfloat16), as the official writer lays them
    out (sorted by name, data 8-byte aligned); the file appears under `path` only once complete."""
    if dtype not in ENCODINGS:
        raise ValueError(f"dtype must be one of {', '.join(ENCODINGS)}, got {dtype!r}")
    code = ENCODINGS[dtype]
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in sorted(tensors):
        shape = np.shape(tensors[name])
        nbytes = math.prod(shape) * ITEMSIZE[code]
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with atomic_write(path) as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        for name in sorted(tensors):
            f.write(memoryview(_encode(tensors[name], dtype).reshape(-1)).cast("B"))


@contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file to write that replaces `path` only when the block ends without an error: a
    hidden temporary file beside it, synced, then renamed over it (atomic)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with suppress(FileNotFoundError):
            tmp.unlink()


def float32_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """The bfloat16 bits (as uint16) nearest to float32 `x`, ties to even, as torch rounds; every
    NaN becomes the quiet NaN 0x7FC0."""
    x = np.asarray(x, dtype=np.float32, order="C")
    bits = x.view(np.uint32)
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 `bits` (uint16): exact, they are a float32's top half."""
    out = np.empty(np.shape(bits), dtype=np.float32)
    wide = out.view(np.uint32)
    wide[...] = bits
    wide <<= 16
    return out


@contextmanager
def _open(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """The file opened for reading; an OS error while it is open becomes a CheckpointError."""
    is_file(path, CheckpointError)  # a directory or FIFO is said to be one, never opened (a FIFO would block)
    try:
        with open(path, "rb") as f:
            yield f
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror or e}") from e


def _parse_header(f: BinaryIO, path: Path) -> dict[str, TensorInfo]:
    """Read and validate the header of the open file `f`; the tensors in the header's order."""
    size = os.fstat(f.fileno()).st_size
    if size < 8:
        raise CheckpointError(f"{path}: file is {size} bytes, too short for the 8-byte header length")
    length = int.from_bytes(f.read(8), "little")
    if length == 0 or length > MAX_HEADER_BYTES:
        raise CheckpointError(f"{path}: header length {length} is not in 1..{MAX_HEADER_BYTES}: not a safetensors file")
    if 8 + length > size:
        raise CheckpointError(f"{path}: file is truncated: the header needs {length} bytes but {size - 8} follow")
    entries = _parse_json(f.read(length), path)
    data_start = 8 + length
    tensors = {
        name: _tensor_info(path, name, entry, data_start, size - data_start)
        for name, entry in entries.items()
        if name != "__metadata__"
    }
    _check_tiling(path, tensors, data_start, size - data_start)
    return tensors


def _parse_json(blob: bytes, path: Path) -> dict:
    """The header's JSON object; it must have unique keys and string-valued metadata."""
    try:
        header = json.loads(blob.decode("utf-8"), object_pairs_hook=unique_keys)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"{path}: header is not valid UTF-8 JSON: {e}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object but {type(header).__name__}")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{path}: header '__metadata__' must map strings to strings")
    return header


def _tensor_info(path: Path, name: str, entry: object, data_start: int, data_size: int) -> TensorInfo:
    """Validate one header entry, including that its bytes lie inside the file's data."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where}: header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:
        raise CheckpointError(f"{where}: unknown dtype {reprlib.repr(dtype)}")
    if not _is_index_list(shape):
        raise CheckpointError(f"{where}: 'shape' must be a list of non-negative integers, got {reprlib.repr(shape)}")
    if not _is_index_list(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise CheckpointError(f"{where}: 'data_offsets' must be [begin, end] with 0 <= begin <= end, "
                              f"got {reprlib.repr(offsets)}")
    begin, end = offsets
    needed = math.prod(shape) * ITEMSIZE[dtype]
    if end - begin != needed:
        raise CheckpointError(f"{where}: 'data_offsets' span {end - begin} bytes but {dtype} {shape} needs {needed}")
    if end > data_size:
        raise CheckpointError(
            f"{path}: file is truncated: tensor {name!r} needs bytes up to {end} but the data holds {data_size}"
        )
    return TensorInfo(dtype, tuple(shape), data_start + begin, needed)


def _check_tiling(path: Path, tensors: dict[str, TensorInfo], data_start: int, data_size: int) -> None:
    """The tensors cover the data buffer exactly, one after another in offset order, as the official
    reader requires: no two overlap, no gap between them, no byte after the last."""
    end = 0
    for name, info in sorted(tensors.items(), key=lambda item: (item[1].offset, item[1].nbytes)):
        begin = info.offset - data_start
        if begin != end:
            fault = f"overlaps the tensors before it, which end at {end}" if begin < end else \
                f"leaves a gap of {begin - end} bytes after the tensors before it"
            raise CheckpointError(f"{path}: tensor {name!r} begins at byte {begin} of the data and {fault}")
        end = begin + info.nbytes
    if end != data_size:
        raise CheckpointError(f"{path}: {data_size - end} bytes follow the last tensor (the tensors end at byte "
                              f"{end} of the data): the official reader refuses such a file")


def _is_index_list(value: object) -> bool:
    """A JSON list of non-negative integers (JSON true/false parse as bools, not accepted)."""
    return isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)


def _float_tensor(path: Path, name: str, info: TensorInfo | None) -> TensorInfo:
    """The header entry of tensor `name`, which must be there and be a float type minigpt decodes."""
    if info is None:
        raise CheckpointError(f"{path}: no tensor {name!r}")
    if info.dtype not in STORAGE:
        raise CheckpointError(
            f"{path}: tensor {name!r} has dtype {info.dtype}, expected float32, float16 or bfloat16 (F32, F16, BF16)"
        )
    return info


def _map(f: BinaryIO, path: Path) -> mmap.mmap:
    """The whole file mapped read-only (the map holds its own reference to the file, which may close)."""
    try:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot map: {getattr(e, 'strerror', None) or e}") from e


def _decode(data: mmap.mmap | bytes, path: Path, name: str, info: TensorInfo) -> np.ndarray:
    """One tensor as float32: F32 a read-only view of the map (a copy only if its bytes are not
    4-aligned in the file, which NumPy and BLAS want), F16 and BF16 decoded into a fresh array."""
    count = math.prod(info.shape)
    if count and info.offset + info.nbytes > len(data):  # the file shrank between its header's check and the map
        raise CheckpointError(f"{path}: file is truncated: tensor {name!r} ends past the end of the file")
    raw = np.frombuffer(data, STORAGE[info.dtype], count, info.offset if count else 0).reshape(info.shape)
    if info.dtype == "BF16":
        return bfloat16_to_float32(raw)
    if info.dtype == "F16" or info.offset % 4:
        return raw.astype(np.float32)
    return raw


def _encode(x: np.ndarray, dtype: str) -> np.ndarray:
    """`x` as C-contiguous little-endian elements of `dtype` (a key of ENCODINGS)."""
    x = np.asarray(x, dtype="<f4", order="C")
    if dtype == "float16":
        return x.astype("<f2")
    if dtype == "bfloat16":
        return float32_to_bfloat16(x).astype("<u2", copy=False)
    return x
