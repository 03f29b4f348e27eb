"""The safetensors format (an 8-byte little-endian header length, a JSON
header of {name: {dtype, shape, data_offsets}} and "__metadata__", then the
tensors' bytes), read into and written from NumPy arrays."""
import json
import struct

import numpy as np

from .errors import DownpourError

_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def load(data, what="the safetensors file"):
    """(tensors, metadata): each tensor a NumPy array of its own (writable,
    native byte order), BF16 widened to float32."""
    data = memoryview(data)
    if len(data) < 8:
        raise DownpourError(f"{what} is {len(data)} bytes, too short for a safetensors header")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise DownpourError(f"{what} declares a {size}-byte header but has {len(data) - 8} bytes")
    try:
        header = json.loads(bytes(data[8:8 + size]))
    except ValueError as e:
        raise DownpourError(f"{what} has a header that is not JSON: {e}") from None
    body = data[8 + size:]
    metadata = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, info in header.items():
        dtype, shape = info.get("dtype"), info.get("shape")
        begin, end = info.get("data_offsets", (0, -1))
        if not 0 <= begin <= end <= len(body):
            raise DownpourError(f"{what}: tensor {name}'s bytes [{begin}, {end}) are outside "
                                f"its {len(body)} bytes of data")
        raw = body[begin:end]
        if dtype == "BF16":
            array = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif dtype in _DTYPES:
            array = np.frombuffer(raw, _DTYPES[dtype])
        else:
            raise DownpourError(f"{what}: tensor {name} has dtype {dtype}, which this client "
                                "does not read")
        count = int(np.prod(shape, dtype=np.int64))
        if array.size != count:
            raise DownpourError(f"{what}: tensor {name} has {array.size} elements for shape "
                                f"{shape}")
        tensors[name] = array.reshape(shape).astype(array.dtype.newbyteorder("="), copy=True)
    return tensors, metadata


def dump(tensors, metadata=None):
    """The safetensors bytes of a {name: array} dict (PyTorch tensors too:
    anything np.asarray takes)."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        array = np.ascontiguousarray(np.asarray(tensors[name]))
        name_of = _NAMES.get(array.dtype.newbyteorder("<")) or _NAMES.get(array.dtype)
        if name_of is None:
            raise DownpourError(f"tensor {name} has dtype {array.dtype}, which safetensors "
                                "does not hold")
        raw = array.astype(_DTYPES[name_of], copy=False).tobytes()
        header[name] = {"dtype": name_of, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # The data begins 8-byte aligned.
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)
