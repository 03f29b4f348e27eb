"""CRC32C (Castagnoli) of many byte strings at once, in NumPy.

TFRecord framing checksums every record (data/record_io.h) and the standard
library has no CRC32C. A byte-at-a-time loop in Python manages a few MB/s;
this computes the checksums of a batch of records together, so Python's
overhead is per batch, not per byte:

  - A reflected CRC started from ~0 equals one started from 0 over the data
    with its first four bytes inverted, and a CRC started from 0 does not
    change over leading zero bytes. So each record, its first four bytes
    inverted, is laid right-aligned in a whole number of W-byte rows (zeros
    in front), and every row of every record is checksummed from 0 at once,
    four bytes a step (two 64K-entry tables): W / 4 vectorized steps.
  - Each record's rows are then folded in order, reg = Z(reg) ^ row_crc,
    where Z, "W zero bytes", is linear (two tables again): one vectorized
    step per row of the longest record.
"""
import numpy as np

_POLY = 0x82F63B78
_MIN_WIDTH = 16
_MAX_WIDTH = 16384
_BLOCK_BYTES = 1 << 22


def _byte_table():
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLY), table >> 1).astype(np.uint32)
    return table


_BYTE = _byte_table()
_WORD = None  # (lo, hi): a register after four bytes, by its low and high 16 bits.
_ZERO = {}  # width W -> (lo, hi) of "W zero bytes".


def _advance(reg, zero_bytes):
    for _ in range(zero_bytes):
        reg = _BYTE[reg & 0xFF] ^ (reg >> 8)
    return reg


def _split16(bytewise):
    """16-bit tables of a linear map given on each byte of each position
    (bytewise[k][b] = map(b << 8k))."""
    x = np.arange(65536, dtype=np.uint32)
    lo = bytewise[0][x & 0xFF] ^ bytewise[1][x >> 8]
    hi = bytewise[2][x & 0xFF] ^ bytewise[3][x >> 8]
    return lo, hi


def _linear_tables(zero_bytes):
    basis = (np.arange(256, dtype=np.uint32)[None, :]
             << (np.uint32(8) * np.arange(4, dtype=np.uint32)[:, None])).ravel()
    return _split16(_advance(basis, zero_bytes).reshape(4, 256))


def _word_tables():
    global _WORD
    if _WORD is None:
        _WORD = _linear_tables(4)
    return _WORD


def _zero_tables(width):
    if width not in _ZERO:
        _ZERO[width] = _linear_tables(width)
    return _ZERO[width]


def _crc_small(data):
    """One record of fewer than four bytes."""
    reg = 0xFFFFFFFF
    for b in data:
        reg = int(_BYTE[(reg ^ b) & 0xFF]) ^ (reg >> 8)
    return reg ^ 0xFFFFFFFF


def crc32c_many(records):
    """The CRC32C of each bytes-like object in `records`, as a uint32 array."""
    n = len(records)
    out = np.zeros(n, dtype=np.uint32)
    if n == 0:
        return out
    lengths = np.fromiter((len(r) for r in records), dtype=np.int64, count=n)
    for i in np.nonzero(lengths < 4)[0]:
        out[i] = _crc_small(bytes(records[i]))
    big = np.nonzero(lengths >= 4)[0]
    if len(big) == 0:
        return out
    sizes = lengths[big]
    longest = int(sizes.max())
    width = _MIN_WIDTH
    while width * width < 4 * longest and width < _MAX_WIDTH:
        width *= 2
    rows = -(-sizes // width)
    padding = rows * width - sizes
    parts = []
    for i, pad in zip(big.tolist(), padding.tolist()):
        parts.append(bytes(pad))
        parts.append(records[i])
    flat = np.frombuffer(b"".join(parts), dtype=np.uint8).copy()
    starts = np.cumsum(rows * width) - sizes
    for k in range(4):
        flat[starts + k] ^= 0xFF
    words = flat.view("<u4").reshape(-1, width // 4)
    lo, hi = _word_tables()
    reg = np.empty(len(words), dtype=np.uint32)
    # A block of rows at a time stays in the cache while its columns are read.
    block = max(1, _BLOCK_BYTES // width)
    for begin in range(0, len(words), block):
        part = words[begin:begin + block]
        r = np.zeros(len(part), dtype=np.uint32)
        for j in range(part.shape[1]):
            r ^= part[:, j]
            r = lo[r & 0xFFFF] ^ hi[r >> 16]
        reg[begin:begin + block] = r
    # Fold each record's rows, the records with most rows first (those still
    # folding are then a prefix).
    first_row = np.cumsum(rows) - rows
    order = np.argsort(-rows, kind="stable")
    first_row, rows_sorted = first_row[order], rows[order]
    zlo, zhi = _zero_tables(width)
    acc = reg[first_row]
    for r in range(1, int(rows_sorted[0])):
        active = int(np.searchsorted(-rows_sorted, -r, side="left"))
        a = acc[:active]
        acc[:active] = zlo[a & 0xFFFF] ^ zhi[a >> 16] ^ reg[first_row[:active] + r]
    done = np.empty(len(big), dtype=np.uint32)
    done[order] = acc ^ np.uint32(0xFFFFFFFF)
    out[big] = done
    return out


def masked_crc32c_many(records):
    """TFRecord's masked CRC32C of each record (common/crc32c.h's MaskCrc)."""
    crc = crc32c_many(records)
    return ((crc >> 15) | (crc << 17)) + np.uint32(0xA282EAD8)
