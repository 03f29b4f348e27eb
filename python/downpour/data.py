"""Training data from NumPy, written as the daemons read it: record files in
TFRecord framing (data/record_io.h: uint64 length, masked CRC32C of the
length, payload, masked CRC32C of the payload; optionally GZIP-compressed
as a whole) holding tf.Example messages (proto/example.proto), in shards
NAME-00000-of-0000N.tfrecord with example k in shard k % N, as
`downpourctl dataset import` writes them.

A job reads them through its spec's dataset: train_files / test_files
globs relative to each worker's --data_dir ("NAME-*.tfrecord"), the model's
input from the feature feature_key (default "image"; a float_list, or a
bytes_list of uint8 values that the daemons scale by 1/255) or from named
inputs (model.inputs: DENSE features and SPARSE int64 ids), and the class
from label_key (default "label", an int64_list of one value).

How each feature's values are stored:
  float arrays            float_list (as float32)
  uint8 arrays            bytes_list: one value per example, its raw bytes
                          (images, as Fashion-MNIST's import stores them)
  other integers, bool    int64_list
  str / bytes             bytes_list (UTF-8 for str)
A feature is an array [n, ...] (every example the same number of values)
or a sequence of n items, each an array, a list of values or a bytes
object (ragged: e.g. a variable number of ids per example).
"""
import gzip
import os
import struct

import numpy as np

from ._crc32c import masked_crc32c_many
from .errors import DownpourError

_BYTES, _FLOAT, _INT64 = 1, 2, 3  # Feature's oneof field numbers.
_KIND_NAMES = {_BYTES: "bytes_list", _FLOAT: "float_list", _INT64: "int64_list"}
_BATCH_BYTES = 32 << 20  # Examples encoded and checksummed together.
_GZIP_MAGIC = b"\x1f\x8b"


def shard_file_name(name, index, shards):
    """NAME-IIIII-of-NNNNN.tfrecord, as data/idx.h's ShardFileName."""
    return f"{name}-{index:05d}-of-{shards:05d}.tfrecord"


def _varint(value):
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varints(values):
    """The varint encodings of int64 `values` (two's complement, as protobuf
    writes a negative int64) concatenated, and each one's end."""
    v = values.astype(np.int64, copy=False).view(np.uint64)
    size = np.ones(len(v), dtype=np.int64)
    for k in range(1, 10):
        size += v >= (np.uint64(1) << np.uint64(7 * k))
    ends = np.cumsum(size)
    out = np.zeros(int(ends[-1]) if len(v) else 0, dtype=np.uint8)
    starts = ends - size
    for k in range(10):
        more = size > k
        if not more.any():
            break
        byte = (v[more] >> np.uint64(7 * k)) & np.uint64(0x7F)
        byte |= (size[more] > k + 1).astype(np.uint64) << np.uint64(7)
        out[starts[more] + k] = byte.astype(np.uint8)
    return out, ends


def _packed(raw, offsets, n):
    """Each example's packed payload: raw[offsets[i]:offsets[i + 1]]."""
    return [raw[offsets[i]:offsets[i + 1]] for i in range(n)]


def _int64_payloads(key, flat, offsets, n):
    if flat.dtype.kind == "u" and len(flat) and flat.max() > np.iinfo(np.int64).max:
        raise DownpourError(f"feature {key!r} has values above int64's range")
    encoded, ends = _varints(flat)
    byte_offsets = np.concatenate([[0], ends])[offsets]
    return _packed(encoded.tobytes(), byte_offsets.tolist(), n)


def _bytes_payload(values):
    return b"".join(b"\x0a" + _varint(len(v)) + v for v in values)


def _dense_column(key, array, n):
    """(kind, payloads) of an array [n, ...]."""
    if array.ndim == 0 or array.shape[0] != n:
        raise DownpourError(f"feature {key!r} has shape {list(array.shape)}; its first "
                            f"dimension must be the {n} examples")
    kind = array.dtype.kind
    if kind == "f":
        rows = np.ascontiguousarray(array, dtype="<f4").reshape(n, -1)
        width = rows.shape[1] * 4
        return _FLOAT, _packed(rows.tobytes(), range(0, (n + 1) * width, width), n)
    if kind == "u" and array.dtype.itemsize == 1:
        rows = np.ascontiguousarray(array).reshape(n, -1)
        width = rows.shape[1]
        raw = rows.tobytes()
        prefix = b"\x0a" + _varint(width)
        return _BYTES, [prefix + raw[i * width:(i + 1) * width] for i in range(n)]
    if kind in "iub":
        rows = np.ascontiguousarray(array).reshape(n, -1)
        count = rows.shape[1]
        return _INT64, _int64_payloads(key, rows.ravel(), [i * count for i in range(n + 1)], n)
    if kind == "U":
        return _BYTES, [_bytes_payload([s.encode() for s in np.ravel(row)]) for row in array]
    if kind == "S":
        raise DownpourError(f"feature {key!r} is a NumPy bytes array, which drops trailing zero "
                            "bytes; pass a list of bytes objects")
    raise DownpourError(f"feature {key!r} has dtype {array.dtype}; use floats, integers, "
                        "uint8 bytes or strings")


def _item_kind(key, index, item):
    """(kind, values) of one example's item of a ragged feature; kind None
    for an empty one."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        return _BYTES, [bytes(item)]
    if isinstance(item, str):
        return _BYTES, [item.encode()]
    if isinstance(item, (list, tuple)) and item and all(
            isinstance(v, (bytes, bytearray, str)) for v in item):
        return _BYTES, [v.encode() if isinstance(v, str) else bytes(v) for v in item]
    values = np.asarray(item)
    if values.size == 0:
        return None, values
    kind = values.dtype.kind
    if kind == "f":
        return _FLOAT, values.ravel()
    if kind == "u" and values.dtype.itemsize == 1 and isinstance(item, np.ndarray):
        return _BYTES, [values.tobytes()]
    if kind in "iub":
        return _INT64, values.ravel()
    raise DownpourError(f"feature {key!r}, example {index}: values of dtype {values.dtype}; "
                        "use floats, integers, uint8 arrays, bytes or strings")


def _ragged_column(key, items, n):
    if len(items) != n:
        raise DownpourError(f"feature {key!r} has {len(items)} examples; the labels and other "
                            f"features have {n}")
    kinds, values = [], []
    for index, item in enumerate(items):
        kind, vals = _item_kind(key, index, item)
        kinds.append(kind)
        values.append(vals)
    found = {k for k in kinds if k is not None}
    if len(found) > 1:
        first = {k: kinds.index(k) for k in found}
        described = ", ".join(f"{_KIND_NAMES[k]} (example {i})" for k, i in sorted(first.items()))
        raise DownpourError(f"feature {key!r} mixes kinds of values: {described}")
    kind = found.pop() if found else _INT64  # All empty: no ids.
    if kind == _BYTES:
        return kind, [_bytes_payload(v) if k is not None else b"" for k, v in zip(kinds, values)]
    dtype = "<f4" if kind == _FLOAT else np.int64
    parts = [np.asarray(v, dtype=dtype).ravel() for v in values]
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype)
    if kind == _FLOAT:
        return kind, _packed(flat.astype("<f4").tobytes(), (offsets * 4).tolist(), n)
    return kind, _int64_payloads(key, flat, offsets.tolist(), n)


def _column(key, value, n):
    if isinstance(value, np.ndarray) and value.dtype != object:
        return _dense_column(key, value, n)
    if isinstance(value, (list, tuple, np.ndarray)):
        return _ragged_column(key, list(value), n)
    raise DownpourError(f"feature {key!r} is a {type(value).__name__}; pass an array [n, ...] "
                        "or a list of n items")


def _count(features, labels):
    """The examples' count, which every feature and the labels must have."""
    counts = {repr(key): len(value) for key, value in features.items()}
    if labels is not None:
        counts["the labels"] = len(labels)
    if not counts:
        raise DownpourError("write_records needs features or labels")
    if len(set(counts.values())) > 1:
        raise DownpourError("features and labels have different lengths: " +
                            ", ".join(f"{k} {v}" for k, v in counts.items()))
    return next(iter(counts.values()))


def encode_examples(features, labels=None, label_key="label"):
    """The serialized tf.Example of each example: features {key: values}
    (see the module's doc) and labels (n integer class ids, or None)."""
    n = _count(features, labels)
    columns = {}
    for key, value in features.items():
        if not isinstance(key, str) or not key:
            raise DownpourError(f"feature key {key!r} must be a non-empty string")
        columns[key] = _column(key, value, n)
    if labels is not None:
        if label_key in columns:
            raise DownpourError(f"feature {label_key!r} is also the label_key; rename one")
        label_array = np.asarray(labels)
        if label_array.ndim == 2 and label_array.shape[1] == 1:
            label_array = label_array[:, 0]
        if label_array.ndim != 1 or label_array.dtype.kind not in "iub":
            raise DownpourError(f"labels must be {n} integer class ids, not an array of "
                                f"{label_array.dtype} shaped {list(label_array.shape)}")
        columns[label_key] = _dense_column(label_key, label_array.astype(np.int64).reshape(n, 1), n)
    # Map entries in key order (bytewise), as protobuf's deterministic
    # serialization writes them.
    prefixes = []
    for key in sorted(columns, key=lambda k: k.encode()):
        kind, payloads = columns[key]
        encoded = key.encode()
        prefixes.append((b"\x0a" + _varint(len(encoded)) + encoded, bytes((kind << 3 | 2,)),
                         kind != _BYTES, payloads))
    records = []
    for i in range(n):
        entries = []
        for key_part, tag, packed, payloads in prefixes:
            payload = payloads[i]
            if packed:
                payload = b"\x0a" + _varint(len(payload)) + payload if payload else b""
            feature = tag + _varint(len(payload)) + payload
            body = key_part + b"\x12" + _varint(len(feature)) + feature
            entries.append(b"\x0a" + _varint(len(body)) + body)
        joined = b"".join(entries)
        records.append(b"\x0a" + _varint(len(joined)) + joined)
    return records


def frame_records(records):
    """The TFRecord framing of `records`, as one bytes object."""
    if not records:
        return b""
    headers = [struct.pack("<Q", len(r)) for r in records]
    crcs = masked_crc32c_many(headers + list(records))
    length_crcs, payload_crcs = crcs[:len(records)], crcs[len(records):]
    parts = []
    for header, length_crc, record, payload_crc in zip(headers, length_crcs.tolist(), records,
                                                       payload_crcs.tolist()):
        parts += (header, struct.pack("<I", length_crc), record, struct.pack("<I", payload_crc))
    return b"".join(parts)


class _Shard:
    """One output file: written as PATH.tmp, renamed to PATH when complete
    (as data/record_io.h's RecordWriter), so a reader never sees half."""

    def __init__(self, path, compression):
        self.path = path
        self.raw = open(path + ".tmp", "wb")
        self.out = self.raw
        if compression == "gzip":
            self.out = gzip.GzipFile(filename="", mode="wb", fileobj=self.raw, compresslevel=6,
                                     mtime=0)

    def close(self):
        if self.out is not self.raw:
            self.out.close()
        self.raw.flush()
        os.fsync(self.raw.fileno())
        self.raw.close()
        os.replace(self.path + ".tmp", self.path)

    def discard(self):
        try:
            if self.out is not self.raw:
                self.out.close()
            self.raw.close()
        finally:
            try:
                os.unlink(self.path + ".tmp")
            except OSError:
                pass


def write_records(out_dir, name, features, labels=None, *, shards=1, compression=None,
                  label_key="label"):
    """Writes n examples as tf.Example records in `shards` files
    out_dir/NAME-IIIII-of-NNNNN.tfrecord (example k in shard k % shards);
    returns their paths.

    features: {key: values}, each an array [n, ...] or a sequence of n
    items (ragged); see the module's doc for how values are stored.
    labels: n integer class ids, stored under label_key (default "label",
    a job spec's default), or None. compression: None or "gzip" (the whole
    file, as TensorFlow's TFRecordOptions(compression_type="GZIP"); the
    daemons detect it).
    """
    if compression not in (None, "gzip"):
        raise DownpourError(f"compression={compression!r} is unknown; use None or 'gzip'")
    if not isinstance(shards, int) or not 1 <= shards <= 99999:
        raise DownpourError(f"shards={shards!r} must be between 1 and 99999")
    if not name or "/" in name:
        raise DownpourError(f"name={name!r} must be a non-empty file name prefix")
    n = _count(features, labels)
    out_dir = os.fspath(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise DownpourError(f"cannot create {out_dir}: {e.strerror}") from None
    paths = [os.path.join(out_dir, shard_file_name(name, s, shards)) for s in range(shards)]
    opened = []
    try:
        for path in paths:
            opened.append(_Shard(path, compression))
        example_bytes = max(1, _example_size(features))
        batch = max(shards, _BATCH_BYTES // example_bytes // shards * shards)
        for begin in range(0, n, batch):
            end = min(n, begin + batch)
            part = {k: v[begin:end] for k, v in features.items()}
            records = encode_examples(part, None if labels is None else labels[begin:end],
                                      label_key)
            # Example k goes to shard k % shards; a batch starts at a multiple of shards.
            for s, shard in enumerate(opened):
                shard.out.write(frame_records(records[s::shards]))
        for shard in opened:
            shard.close()
    except OSError as e:
        for shard in opened:
            shard.discard()
        raise DownpourError(f"cannot write records under {out_dir}: {e.strerror}") from None
    except BaseException:
        for shard in opened:
            shard.discard()
        raise
    return paths


def _example_size(features):
    """About how many bytes one example takes (for the batch size)."""
    size = 16
    for value in features.values():
        if isinstance(value, np.ndarray) and value.dtype != object and value.ndim:
            size += value[:1].nbytes + 16
        else:
            size += 64
    return size


def read_records(path, compression="auto"):
    """Yields the payload of each record of a record file, checking every
    checksum (DownpourError "corrupt record in PATH at offset N: ...").
    compression: "auto" (GZIP when the file starts with gzip's magic bytes
    and is no valid uncompressed record), None or "gzip"."""
    path = os.fspath(path)
    if compression not in ("auto", None, "gzip"):
        raise DownpourError(f"compression={compression!r} is unknown; use 'auto', None or 'gzip'")
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError as e:
        raise DownpourError(f"cannot open record file {path}: {e.strerror}") from None
    gzipped = compression == "gzip"
    if compression == "auto" and head[:2] == _GZIP_MAGIC:
        gzipped = len(head) < 12 or struct.unpack("<I", head[8:12])[0] != \
            int(masked_crc32c_many([head[:8]])[0])
    if compression == "gzip" and head[:2] != _GZIP_MAGIC:
        raise DownpourError(f"record file {path} is not GZIP-compressed")
    with (gzip.open if gzipped else open)(path, "rb") as f:
        yield from _read_framed(f, path)


def _read_framed(f, path):
    offset, batch = 0, []

    def corrupt(at, what):
        return DownpourError(f"corrupt record in {path} at offset {at}: {what}")

    def checked(batch):
        crcs = masked_crc32c_many([h for _, h, _, _ in batch] + [p for _, _, p, _ in batch])
        count = len(batch)
        for i, (at, _, payload, stored) in enumerate(batch):
            if struct.unpack("<I", stored[0])[0] != int(crcs[i]):
                raise corrupt(at, "length checksum mismatch")
            if struct.unpack("<I", stored[1])[0] != int(crcs[count + i]):
                raise corrupt(at, "payload checksum mismatch")
            yield payload

    size = 0
    while True:
        try:
            header = f.read(12)
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise DownpourError(f"corrupt gzip stream in {path}: {e}") from None
        if not header:
            break
        if len(header) < 12:
            raise corrupt(offset, "truncated header")
        (length,) = struct.unpack("<Q", header[:8])
        if length > 1 << 30:
            raise corrupt(offset, f"absurd length {length}")
        try:
            body = f.read(length + 4)
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise DownpourError(f"corrupt gzip stream in {path}: {e}") from None
        if len(body) < length + 4:
            raise corrupt(offset, "truncated record")
        batch.append((offset, header[:8], body[:length], (header[8:12], body[length:])))
        offset += 16 + length
        size += length
        if size >= _BATCH_BYTES or len(batch) >= 65536:
            yield from checked(batch)
            batch, size = [], 0
    yield from checked(batch)


def decode_example(record):
    """A serialized tf.Example as {key: values}: float_list as a float32
    array, int64_list as an int64 array, bytes_list as a list of bytes."""
    out = {}
    for field, example_body in _fields(record):
        if field != 1:
            continue
        for entry_field, entry in _fields(example_body):
            if entry_field != 1:
                continue
            key, feature = "", b""
            for f, value in _fields(entry):
                if f == 1:
                    key = bytes(value).decode()
                elif f == 2:
                    feature = value
            out[key] = _decode_feature(feature)
    return out


def _decode_feature(feature):
    result = []
    for kind, body in _fields(feature):
        if kind == _BYTES:
            result = [bytes(v) for f, v in _fields(body) if f == 1]
        elif kind == _FLOAT:
            parts = [np.frombuffer(v, "<f4") for f, v in _fields(body) if f == 1]
            result = np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
        elif kind == _INT64:
            values = []
            for f, v in _fields(body):
                if f == 1:
                    values += _read_varints(v)
            result = np.array(values, dtype=np.uint64).view(np.int64)
    return result


def _read_varint(data, at):
    value, shift = 0, 0
    while True:
        if at >= len(data):
            raise DownpourError("a tf.Example record ends inside a varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7


def _read_varints(data):
    values, at = [], 0
    while at < len(data):
        value, at = _read_varint(data, at)
        values.append(value & 0xFFFFFFFFFFFFFFFF)
    return values


def _fields(data):
    """(field number, bytes) of each length-delimited field; other wire
    types are skipped."""
    data = memoryview(data)
    at = 0
    while at < len(data):
        tag, at = _read_varint(data, at)
        wire = tag & 7
        if wire == 2:
            length, at = _read_varint(data, at)
            if at + length > len(data):
                raise DownpourError("a tf.Example record is truncated")
            yield tag >> 3, data[at:at + length]
            at += length
        elif wire == 0:
            _, at = _read_varint(data, at)
        elif wire == 5:
            at += 4
        elif wire == 1:
            at += 8
        else:
            raise DownpourError(f"a tf.Example record has wire type {wire}")
