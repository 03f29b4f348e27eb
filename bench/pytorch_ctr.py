#!/usr/bin/env python3
"""PyTorch baseline of the click model (bench/ctr_session.sh, stage pytorch):
trains the DLRM of a Downpour job spec (examples/ctr_dlrm.pbtxt) on the
record files Downpour trains on, in one process on one device, and reports
test AUC and log loss beside steady-state examples/s.

  python3 bench/pytorch_ctr.py --data DATA_DIR [--spec examples/ctr_dlrm.pbtxt]
      [--workers 2] [--steps N] [--device cuda|cpu] [--seed 1]

DATA_DIR is what a worker's --data_dir would be: the spec's train_files and
test_files patterns are relative to it (the ctr stage generates into
DATA_DIR/ctr with `downpourctl dataset generate --kind=ctr`).

The data. Record files in TFRecord framing (length, masked CRC32C of the
length, payload, masked CRC32C of the payload; a whole file may be gzip'd),
every CRC checked (with the crc32c or google-crc32c package when one is
installed, else NumPy), each payload a tf.train.Example parsed here without
TensorFlow, vectorised over a file's records with NumPy: what Downpour's
reader accepts (data/example_inputs.cc) is read the same way (packed or
unpacked lists, unknown fields skipped, a key given twice: the last wins, a
sparse feature absent: no ids, a dense one absent or of the wrong size, a
sparse one over max_ids, a label not one int64: an error naming the file
and record). Files are parsed in parallel (one process per file, at most
one per core). The parsed splits are cached beside the data, in
pytorch_ctr.cache/ in the folder of the first training file (a key of the
files' names, sizes and times and of the spec's inputs; --no_cache skips
it): ids are mapped once to rows of the tables (with hash_ids, Downpour's
rows are a 64-bit mix of the id, so distinct ids are distinct rows: here,
the distinct ids of the training and test sets in sorted order) and kept as
int32, padded to the most ids any example has. Everything is read and moved
to the device before the clock starts.

What matches the job spec (read with a small text-format parser):
  model      its layers as listed (dense, relu, sparse embedding,
             dot_interaction, concat, softmax_cross_entropy; another kind is
             refused): dense weights He-uniform (limit sqrt(6 / fan_in)),
             biases zero, as spec/params.cc; sparse rows uniform in
             [-init_scale, init_scale] (default 1 / sqrt(dim)); an example's
             ids pooled by SUM or MEAN (1 / count, no ids: zeros), a repeated
             id counted each time, as worker/sparse_batch.cc; the pairs of
             dot_interaction in the order (0,1), (0,2), ..., (1,2), ...
  loss       softmax cross-entropy over num_classes (2), the batch mean;
             P(click) = sigmoid(logit 1 - logit 0), as the workers score.
  batch      batch_size x --workers (default the spec's num_workers): a SYNC
             step averages the workers' gradients of their batch means,
             which is the gradient of the mean over the joined batch, for
             the dense weights and (shards' SparseStore: the ranks' row
             sums over the ranks that pushed) for the rows alike.
  optimizer  dense: the job's optimizer (ADAM, ADAGRAD, MOMENTUM, SGD) as
             torch.optim (the same updates; fused Adam on CUDA). Sparse
             rows: the table's optimizer (else the job's) per row, lazily,
             as ps/sparse_table.cc: only rows the step's batch touched are
             updated, each with its own state and, for Adam, its own update
             count t for the bias corrections (lr / (1 - b1^t) and
             1 / sqrt(1 - b2^t) in double), the step in float as
             kernels/cpu/optimizer.cc writes it. Rows the training set never
             touched keep their initial values, which is what an
             evaluation's read of a row that does not exist returns there.
             (torch.optim.SparseAdam is not used: its bias correction
             counts steps, not a row's updates.) Constant learning rates
             only: a spec with a schedule is refused.
  steps      the spec's steps (--steps overrides); every batch is full, the
             training set reshuffled (torch.randperm, seeded) each epoch and
             batches running on across epochs, as Downpour's reader repeats.
  evaluation every eval_every_steps and at the end, on the whole test set:
             AUC (exact, ties counting one half) and log loss (probability
             clamped to 1e-15), as common/binary_metrics.cc.
  precision  the spec's (FP32 unless it says BF16; --precision overrides):
             fp32 leaves PyTorch's defaults (fp32 matmuls); bf16 autocasts
             the dense layers (the rows and the optimizers stay fp32).

What does not match (judge the comparison with it): one process and one
device instead of a worker per rank exchanging with shards; a global
permutation each epoch instead of each rank's files through a shuffle
buffer (the examples are independent draws, so this changes no
expectation); PyTorch's random initial values, not Downpour's SplitMix64
ones; no eviction (a table's max_rows is ignored: every row is kept); the
shards' memory and network are not simulated; eager mode (no torch.compile,
no CUDA graphs). Floating-point sums run in other orders than Downpour's.

Output, one JSON line per evaluation,
  {"eval": STEP, "examples_per_s": RATE_SO_FAR, "auc": A, "log_loss": L, "t_s": T}
and a final one with system, model, device, precision, workers, batch, steps,
examples_per_s (steady state: training steps after the first --warmup_steps,
evaluations excluded, the device synchronised at the windows' ends),
examples_per_s_all_steps (every training step, evaluations excluded),
train_s (the clock: first step to the end, evaluations included), eval_s,
load_s (before the clock), auc, log_loss, accuracy, and the generator's
Bayes figures when its summary (NAME.json) is beside the data.

Exits 2 with one message for a bad flag, spec or data file, or when
PyTorch, NumPy or CUDA (for --device cuda) is missing.
"""
import time

T_SCRIPT = time.time()

import argparse
import ast
import glob
import gzip
import hashlib
import json
import math
import multiprocessing
import os
import re
import shutil
import struct
import sys

# ---------------------------------------------------------------- errors


class InputError(Exception):
    """Bad input the user can fix: reported in one line, exit status 2."""


def die(message):
    print(f'pytorch_ctr.py: {message}', file=sys.stderr, flush=True)
    sys.exit(2)


try:
    import numpy as np
except ImportError as e:
    die(f'NumPy is not installed for {sys.executable} ({e}); pip install numpy')

# ---------------------------------------------------------------- job spec

# Protobuf text format: comments, strings, words (names, numbers, enums) and
# punctuation.
_TOKEN = re.compile(r'\s+|#[^\n]*|("(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\')'
                    r'|([\w.+-]+)|([{}\[\]:,;<>])')


def _tokens(text, path):
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            line = text.count('\n', 0, pos) + 1
            raise InputError(f'{path}:{line}: cannot read {text[pos:pos + 20]!r}')
        if m.lastindex:
            out.append((m.group(m.lastindex), m.lastindex, text.count('\n', 0, pos) + 1))
        pos = m.end()
    return out


def _scalar(text, kind):
    if kind == 1:
        return ast.literal_eval(text)
    if text in ('true', 'True'):
        return True
    if text in ('false', 'False'):
        return False
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text  # An enum value's name.


def parse_text_proto(text, path):
    """A protobuf text-format message as {field: [values]}; a value is a
    scalar (str, int, float, bool; enums as their names) or such a dict."""
    tokens = _tokens(text, path)
    i = 0

    def fail(message):
        line = tokens[min(i, len(tokens) - 1)][2] if tokens else 1
        raise InputError(f'{path}:{line}: {message}')

    def message(closing):
        nonlocal i
        fields = {}
        while True:
            if i >= len(tokens):
                if closing is None:
                    return fields
                fail(f'missing {closing!r}')
            text_, kind, _ = tokens[i]
            if closing is not None and text_ == closing:
                i += 1
                return fields
            if kind != 2:
                fail(f'expected a field name, got {text_!r}')
            name = text_
            i += 1
            colon = i < len(tokens) and tokens[i][0] == ':'
            if colon:
                i += 1
            values = fields.setdefault(name, [])
            if i < len(tokens) and tokens[i][0] == '[':
                i += 1
                while i < len(tokens) and tokens[i][0] != ']':
                    values.append(value())
                    if i < len(tokens) and tokens[i][0] == ',':
                        i += 1
                i += 1
            else:
                values.append(value())
            if i < len(tokens) and tokens[i][0] in (',', ';'):
                i += 1

    def value():
        nonlocal i
        if i >= len(tokens):
            fail('missing a value')
        text_, kind, _ = tokens[i]
        if text_ in ('{', '<'):
            i += 1
            return message('}' if text_ == '{' else '>')
        if kind == 3:
            fail(f'expected a value, got {text_!r}')
        i += 1
        return _scalar(text_, kind)

    return message(None)


def first(msg, field, default=None):
    """A singular field: its last value (as protobuf merges), else default."""
    values = msg.get(field) if msg else None
    return values[-1] if values else default


def every(msg, field):
    return (msg or {}).get(field, [])


LAYER_KINDS = ('dense', 'relu', 'flatten', 'dropout', 'softmax_cross_entropy', 'conv2d',
               'max_pool', 'avg_pool', 'global_avg_pool', 'batch_norm', 'add', 'embedding',
               'concat', 'dot_interaction')
SUPPORTED = ('dense', 'relu', 'embedding', 'concat', 'dot_interaction', 'softmax_cross_entropy')
OPTIMIZER_DEFAULTS = {'ADAM': 1e-8, 'ADAGRAD': 1e-10}  # epsilon


def optimizer_of(spec, what):
    """An OptimizerSpec with Downpour's defaults (ps/lr_schedule.h)."""
    kind = first(spec, 'kind', 'SGD')
    if kind not in ('SGD', 'MOMENTUM', 'ADAGRAD', 'ADAM'):
        raise InputError(f'{what}: optimizer kind {kind} is unknown')
    schedule = first(spec, 'schedule')
    if schedule and (first(schedule, 'kind', 'CONSTANT') != 'CONSTANT' or
                     first(schedule, 'warmup_steps', 0)):
        raise InputError(f'{what}: this baseline implements constant learning rates only; '
                         'the spec has a schedule')
    return {
        'kind': kind,
        'lr': float(first(spec, 'learning_rate', 0.0)),
        'momentum': float(first(spec, 'momentum', 0.0) or 0.9),
        'beta1': float(first(spec, 'beta1', 0.0) or 0.9),
        'beta2': float(first(spec, 'beta2', 0.0) or 0.999),
        'epsilon': float(first(spec, 'epsilon', 0.0) or OPTIMIZER_DEFAULTS.get(kind, 1e-8)),
        'weight_decay': float(first(spec, 'weight_decay', 0.0)),
    }


def read_job(path):
    """What the baseline needs of a job spec: inputs, layers (kinds, inputs,
    widths), tables, optimizers, dataset and schedule fields."""
    try:
        text = open(path).read()
    except OSError as e:
        raise InputError(f'cannot read the job spec {path}: {e.strerror}')
    spec = parse_text_proto(text, path)
    model = first(spec, 'model')
    if not model:
        raise InputError(f'{path} has no model')
    if int(first(model, 'num_classes', 0)) != 2:
        raise InputError(f'{path}: num_classes is {first(model, "num_classes", 0)}; the click '
                         'baseline models two classes')
    inputs = {}
    for k, spec_input in enumerate(every(model, 'inputs')):
        name = first(spec_input, 'name', '')
        sparse = first(spec_input, 'kind', 'DENSE') == 'SPARSE'
        features = every(spec_input, 'features') or [name]
        shape = every(spec_input, 'shape')
        inputs[name] = {
            'name': name, 'sparse': sparse, 'features': [str(f) for f in features],
            'width': int(math.prod(shape)) if shape else len(features),
            'max_ids': int(first(spec_input, 'max_ids', 0)) or 64,
        }
        if sparse and len(features) != 1:
            raise InputError(f'{path}: sparse input {name} must read exactly one feature')
    if not inputs:
        raise InputError(f'{path}: the model has no named inputs (ModelSpec.inputs); the click '
                         'baseline reads named dense and sparse inputs')
    job_optimizer = optimizer_of(first(spec, 'optimizer'), f'{path}: optimizer')
    layers, tables, width = [], [], {}
    for name, i in inputs.items():
        width[name] = i['width']
    previous = None
    for index, layer in enumerate(every(model, 'layer')):
        kinds = [k for k in LAYER_KINDS if k in layer]
        if len(kinds) != 1:
            raise InputError(f'{path}: model.layer[{index}] has no layer type')
        kind = kinds[0]
        name = first(layer, 'name', '') or f'{kind}{index}'
        what = f'{path}: model.layer[{index}] ("{name}")'
        if kind not in SUPPORTED:
            raise InputError(f'{what}: {kind} is not modelled by this baseline '
                             f'(it models {", ".join(SUPPORTED)})')
        if name in width:
            raise InputError(f'{what}: duplicate name')
        reads = [str(x) for x in every(layer, 'inputs')]
        if not reads:
            if previous is None:
                if len(inputs) != 1:
                    raise InputError(f'{what}: set inputs: the model has {len(inputs)} inputs')
                reads = list(inputs)
            else:
                reads = [previous]
        for r in reads:
            if r not in width:
                raise InputError(f'{what}: input "{r}" is not a model input or an earlier layer')
        body = first(layer, kind) or {}
        entry = {'name': name, 'kind': kind, 'inputs': reads}
        if kind == 'dense':
            entry['in'], entry['units'] = width[reads[0]], int(first(body, 'units', 0))
            entry['bias'] = not first(body, 'no_bias', False)
            out = entry['units']
        elif kind == 'relu':
            out = width[reads[0]]
        elif kind == 'concat':
            out = sum(width[r] for r in reads)
        elif kind == 'dot_interaction':
            if len({width[r] for r in reads}) != 1:
                raise InputError(f'{what}: dot_interaction inputs must have one width')
            out = len(reads) * (len(reads) - 1) // 2
        elif kind == 'embedding':
            if not first(body, 'sparse', False) or reads[0] not in inputs or \
                    not inputs[reads[0]]['sparse']:
                raise InputError(f'{what}: the baseline models sparse embeddings of SPARSE '
                                 'inputs only')
            dim = int(first(body, 'dim', 0))
            has_own = first(body, 'optimizer') is not None
            tables.append({
                'name': f'{name}/table', 'layer': name, 'input': reads[0], 'dim': dim,
                'hash_ids': bool(first(body, 'hash_ids', False)),
                'vocab_size': int(first(body, 'vocab_size', 0)),
                'mean': first(body, 'combiner', 'SUM') == 'MEAN',
                'init_scale': float(first(body, 'init_scale', 0.0)) or 1 / math.sqrt(dim),
                'optimizer': optimizer_of(first(body, 'optimizer'), what) if has_own
                else job_optimizer,
                'max_rows': int(first(body, 'max_rows', 0)),
            })
            if not tables[-1]['hash_ids'] and tables[-1]['vocab_size'] <= 0:
                raise InputError(f'{what}: vocab_size must be positive without hash_ids')
            entry['table'] = len(tables) - 1
            out = dim
        else:  # softmax_cross_entropy
            out = width[reads[0]]
            if out != 2:
                raise InputError(f'{what}: expects 2 logits, gets {out}')
        width[name] = out
        entry['width'] = out
        layers.append(entry)
        previous = name
    if not layers or layers[-1]['kind'] != 'softmax_cross_entropy':
        raise InputError(f'{path}: the last layer must be softmax_cross_entropy')
    if not tables:
        raise InputError(f'{path}: the model has no sparse embedding')
    if len({t['dim'] for t in tables}) != 1 or \
            len({json.dumps(t['optimizer'], sort_keys=True) for t in tables}) != 1:
        raise InputError(f'{path}: the baseline holds every table in one array: they need one '
                         'dim and one optimizer')
    dataset = first(spec, 'dataset') or {}
    consistency = first(first(spec, 'consistency'), 'mode', 'SYNC')
    return {
        'name': first(spec, 'name', os.path.basename(path)), 'inputs': inputs, 'layers': layers,
        'tables': tables, 'optimizer': job_optimizer,
        'train_files': first(dataset, 'train_files', ''),
        'test_files': first(dataset, 'test_files', ''),
        'label_key': first(dataset, 'label_key', '') or 'label',
        'batch_size': int(first(dataset, 'batch_size', 0)),
        'num_workers': int(first(spec, 'num_workers', 0)) or 1,
        'steps': int(first(spec, 'steps', 0)),
        'eval_every_steps': int(first(spec, 'eval_every_steps', 0)),
        'seed': int(first(spec, 'seed', 0)),
        'precision': first(spec, 'precision', 'FP32'),
        'consistency': consistency,
    }


# ---------------------------------------------------------------- record files

_CRC_TABLE = None


def _crc_table():
    global _CRC_TABLE
    if _CRC_TABLE is None:
        table = np.arange(256, dtype=np.uint32)
        for _ in range(8):
            table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1)
        _CRC_TABLE = table.astype(np.uint32)
    return _CRC_TABLE


def crc32c_many(buf, starts, lengths):
    """CRC32C of buf[starts[i]:starts[i] + lengths[i]] for every i, a byte
    position at a time over all of them (NumPy; no package needed)."""
    table = _crc_table()
    order = np.argsort(-lengths, kind='stable')
    s, n = starts[order], lengths[order]
    crc = np.full(len(s), 0xFFFFFFFF, dtype=np.uint32)
    active = len(s)
    for k in range(int(n[0]) if len(n) else 0):
        while active and n[active - 1] <= k:
            active -= 1
        c = crc[:active]
        crc[:active] = table[(c ^ buf[s[:active] + k]) & 0xFF] ^ (c >> 8)
    out = np.empty_like(crc)
    out[order] = crc ^ np.uint32(0xFFFFFFFF)
    return out


def _crc_function():
    """A fast CRC32C of one buffer, from a package if one is installed."""
    try:
        import crc32c
        return crc32c.crc32c
    except ImportError:
        pass
    try:
        import google_crc32c
        return google_crc32c.value
    except ImportError:
        return None


def masked(crc):
    crc = np.asarray(crc, dtype=np.uint64)
    return (((crc >> np.uint64(15)) | (crc << np.uint64(17))) + np.uint64(0xA282EAD8)) & \
        np.uint64(0xFFFFFFFF)


def read_records(path):
    """A record file's bytes and its payloads' (starts, lengths), every CRC
    checked, as data/record_io.cc reads it."""
    try:
        with open(path, 'rb') as f:
            data = f.read()
    except OSError as e:
        raise InputError(f'cannot read record file {path}: {e.strerror}')
    buf = np.frombuffer(data, dtype=np.uint8)
    if data[:2] == b'\x1f\x8b':
        # gzip's magic: unless the bytes are also a valid uncompressed header.
        plain = len(data) >= 12 and int(masked(crc32c_many(buf, np.array([0]),
                                                          np.array([8])))[0]) == \
            struct.unpack_from('<I', data, 8)[0]
        if not plain:
            try:
                data = gzip.decompress(data)
            except (OSError, EOFError, ValueError) as e:
                raise InputError(f'corrupt gzip stream in {path}: {e}')
            buf = np.frombuffer(data, dtype=np.uint8)
    unpack = struct.Struct('<Q').unpack_from
    size, pos = len(data), 0
    starts, lengths = [], []
    while pos < size:
        if size - pos < 12:
            raise InputError(f'corrupt record in {path} at offset {pos}: truncated header')
        length = unpack(data, pos)[0]
        if length > 1 << 30 or pos + 16 + length > size:
            raise InputError(f'corrupt record in {path} at offset {pos}: length {length} '
                             'runs past the end of the file')
        starts.append(pos + 12)
        lengths.append(length)
        pos += 16 + length
    starts = np.array(starts, dtype=np.int64)
    lengths = np.array(lengths, dtype=np.int64)
    headers = starts - 12
    stored = buf[np.add.outer(headers + 8, np.arange(4))].astype(np.uint64) @ \
        (np.uint64(1) << (np.uint64(8) * np.arange(4, dtype=np.uint64)))
    bad = np.flatnonzero(masked(crc32c_many(buf, headers, np.full(len(starts), 8))) != stored)
    if len(bad):
        raise InputError(f'corrupt record in {path} at offset {headers[bad[0]]}: '
                         'length checksum mismatch')
    footers = starts + lengths
    stored = buf[np.add.outer(footers, np.arange(4))].astype(np.uint64) @ \
        (np.uint64(1) << (np.uint64(8) * np.arange(4, dtype=np.uint64)))
    crc = _crc_function()
    if crc is None:
        computed = crc32c_many(buf, starts, lengths)
    else:
        view = memoryview(data)
        computed = np.fromiter((crc(view[s:s + n]) for s, n in zip(starts.tolist(),
                                                                 lengths.tolist())),
                               dtype=np.uint64, count=len(starts))
    bad = np.flatnonzero(masked(computed) != stored)
    if len(bad):
        raise InputError(f'corrupt record in {path} at offset {headers[bad[0]]}: '
                         'data checksum mismatch')
    return buf, starts, lengths


# ---------------------------------------------------------------- tf.Example

class WireError(Exception):
    """Bytes that are not protobuf wire format; carries an index into the
    region arrays of the call that found it."""

    def __init__(self, index):
        super().__init__(index)
        self.index = index


def read_varints(buf, pos, limit):
    """The varints at buf[pos[i]:] (none may pass limit[i]): (values as
    uint64, positions after them)."""
    if len(pos) and (pos >= limit).any():
        raise WireError(int(np.flatnonzero(pos >= limit)[0]))
    b = buf[pos]
    value = (b & 0x7F).astype(np.uint64)
    after = pos + 1
    more = np.flatnonzero(b & 0x80)
    shift = 7
    while len(more):
        p = after[more]
        over = p >= limit[more]
        if shift > 63 or over.any():
            raise WireError(int(more[np.flatnonzero(over)[0]] if over.any() else more[0]))
        b = buf[p]
        value[more] |= (b & 0x7F).astype(np.uint64) << np.uint64(shift)
        after[more] = p + 1
        more = more[(b & 0x80) != 0]
        shift += 7
    return value, after


def scan_fields(buf, start, end):
    """Every field of the messages buf[start[i]:end[i]], in lockstep over
    the messages: arrays (owner i, field number, wire type, value start,
    value end), a length-delimited value's bytes or a scalar's own."""
    owners, numbers, types, starts, ends = [], [], [], [], []
    idx = np.flatnonzero(start < end)
    pos, limit = start[idx], end[idx]
    while len(idx):
        try:
            tag, p = read_varints(buf, pos, limit)
        except WireError as e:
            raise WireError(int(idx[e.index]))
        wire = (tag & np.uint64(7)).astype(np.int64)
        number = (tag >> np.uint64(3)).astype(np.int64)
        value_end = np.empty_like(p)
        value_start = p.copy()
        for t, size in ((1, 8), (5, 4)):
            m = wire == t
            value_end[m] = p[m] + size
        m = np.flatnonzero(wire == 0)
        if len(m):
            try:
                value_end[m] = read_varints(buf, p[m], limit[m])[1]
            except WireError as e:
                raise WireError(int(idx[m[e.index]]))
        m = np.flatnonzero(wire == 2)
        if len(m):
            try:
                length, q = read_varints(buf, p[m], limit[m])
            except WireError as e:
                raise WireError(int(idx[m[e.index]]))
            room = (limit[m] - q).astype(np.uint64)
            if (length > room).any():
                raise WireError(int(idx[m[np.flatnonzero(length > room)[0]]]))
            value_start[m] = q
            value_end[m] = q + length.astype(np.int64)
        bad = ((wire != 0) & (wire != 1) & (wire != 2) & (wire != 5)) | (number == 0) | \
            (value_end > limit)
        if bad.any():
            raise WireError(int(idx[np.flatnonzero(bad)[0]]))
        owners.append(idx)
        numbers.append(number)
        types.append(wire)
        starts.append(value_start)
        ends.append(value_end)
        keep = value_end < limit
        idx, pos, limit = idx[keep], value_end[keep], limit[keep]
    if not owners:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty, empty
    return tuple(np.concatenate(a) for a in (owners, numbers, types, starts, ends))


def packed_varints(buf, start, end):
    """The varints packed in buf[start[i]:end[i]]: (values as int64, the
    region each came from, the byte position each starts at), region after
    region."""
    lengths = end - start
    total = int(lengths.sum())
    if total == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    at = np.arange(total) + np.repeat(start - (np.cumsum(lengths) - lengths), lengths)
    b = buf[at]
    last = np.flatnonzero(b < 0x80)
    # Each region must end on a varint's last byte, so none crosses regions.
    region_end = np.cumsum(lengths)
    ends = region_end[lengths > 0] - 1
    torn = b[ends] >= 0x80
    if torn.any():
        raise WireError(int(np.flatnonzero(lengths > 0)[np.flatnonzero(torn)[0]]))
    firsts = np.empty_like(last)
    firsts[0] = 0
    firsts[1:] = last[:-1] + 1
    size = last - firsts + 1
    if (size > 10).any():
        raise WireError(int(np.searchsorted(region_end, firsts[np.flatnonzero(size > 10)[0]],
                                            side='right')))
    values = np.zeros(len(firsts), dtype=np.uint64)
    for k in range(int(size.max())):
        sel = np.flatnonzero(size > k) if k >= int(size.min()) else slice(None)
        values[sel] |= (b[firsts[sel] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    counts = np.diff(np.concatenate([[0], np.searchsorted(last, region_end - 1, side='right')]))
    return values.view(np.int64), np.repeat(np.arange(len(start)), counts), at[firsts]


def key_codes(buf, start, end):
    """Each key buf[start[i]:end[i]] as (its first 8 bytes little-endian in
    a uint64, its length)."""
    lengths = end - start
    k = np.arange(8)
    got = buf[np.minimum(start[:, None] + k, len(buf) - 1)]
    got[k >= lengths[:, None]] = 0
    return got.view('<u8').reshape(-1), lengths


def code_of(key):
    return int.from_bytes(key[:8].ljust(8, b'\0'), 'little')


def decode_examples(buf, starts, lengths, layout, path, first_record):
    """The wanted features of the tf.train.Examples at buf[starts[i]:
    starts[i] + lengths[i]]: dense inputs [n, width] float32, labels [n],
    and for each sparse input its ids (int64, example after example) and
    their counts [n]."""
    n = len(starts)

    def corrupt(record, what):
        return InputError(f'record {first_record + int(record)} of {path}: {what}')

    try:
        owner, number, wire, vs, ve = scan_fields(buf, starts, starts + lengths)
    except WireError as e:
        raise corrupt(e.index, 'not a tf.train.Example (bad wire format)')
    m = (number == 1) & (wire == 2)  # Example.features, merged when repeated.
    feature_record = owner[m]
    try:
        owner, number, wire, es, ee = scan_fields(buf, vs[m], ve[m])
    except WireError as e:
        raise corrupt(feature_record[e.index], 'not a tf.train.Example (bad wire format)')
    m = (number == 1) & (wire == 2)  # Features.feature: map entries.
    entry_record = feature_record[owner[m]]
    try:
        owner, number, wire, fs, fe = scan_fields(buf, es[m], ee[m])
    except WireError as e:
        raise corrupt(entry_record[e.index], 'not a tf.train.Example (bad wire format)')
    entries = int(m.sum())
    is_key = (number == 1) & (wire == 2)
    is_value = (number == 2) & (wire == 2)
    key_count = np.bincount(owner[is_key], minlength=entries)
    value_count = np.bincount(owner[is_value], minlength=entries)
    odd = np.flatnonzero((key_count > 1) | (value_count > 1))
    if len(odd):
        raise corrupt(entry_record[odd[0]], 'a feature map entry with two keys or two values '
                      '(this reader does not merge them)')
    key_start = np.zeros(entries, dtype=np.int64)
    key_end = np.zeros(entries, dtype=np.int64)
    key_start[owner[is_key]], key_end[owner[is_key]] = fs[is_key], fe[is_key]
    value_start = np.zeros(entries, dtype=np.int64)
    value_end = np.zeros(entries, dtype=np.int64)
    value_start[owner[is_value]], value_end[owner[is_value]] = fs[is_value], fe[is_value]

    # Which wanted key (slot) each entry is; the last entry of a key wins.
    keys = layout['keys']
    codes, key_length = key_codes(buf, key_start, key_end)
    slot = np.full(entries, -1, dtype=np.int64)
    for s, key in enumerate(keys):
        encoded = key.encode()
        cand = np.flatnonzero((codes == np.uint64(code_of(encoded))) &
                              (key_length == len(encoded)))
        if len(encoded) > 8:  # Beyond the code: compare the bytes.
            got = buf[key_start[cand, None] + np.arange(len(encoded))]
            cand = cand[(got == np.frombuffer(encoded, dtype=np.uint8)).all(axis=1)]
        slot[cand] = s
    match = slot >= 0
    chosen = np.flatnonzero(match)
    slot = slot[chosen]
    pair = entry_record[chosen] * len(keys) + slot
    if np.bincount(pair, minlength=n * len(keys)).max(initial=0) > 1:
        # A key given twice in a record: the last entry wins. Sorting by
        # (pair, position) and keeping each pair's last keeps it.
        order = np.lexsort((key_start[chosen], pair))
        chosen, pair, slot = chosen[order], pair[order], slot[order]
        last = np.ones(len(pair), dtype=bool)
        last[:-1] = pair[1:] != pair[:-1]
        chosen, slot = chosen[last], slot[last]
    record = entry_record[chosen]
    # entry_of[r, s]: the index into `chosen` of record r's key s, or -1.
    entry_of = np.full((n, len(keys)), -1, dtype=np.int64)
    entry_of[record, slot] = np.arange(len(chosen))

    # Feature: its list (1 bytes_list, 2 float_list, 3 int64_list).
    try:
        owner, number, wire, ls, le = scan_fields(buf, value_start[chosen], value_end[chosen])
    except WireError as e:
        raise corrupt(record[e.index], 'not a tf.train.Example (bad wire format)')
    is_list = (wire == 2) & (number >= 1) & (number <= 3)
    kind = np.zeros(len(chosen), dtype=np.int64)
    if np.bincount(owner[is_list], minlength=len(chosen)).max(initial=0) > 1:
        bad = np.flatnonzero(np.bincount(owner[is_list], minlength=len(chosen)) > 1)[0]
        raise corrupt(record[bad], 'a feature with two lists (this reader does not merge them)')
    kind[owner[is_list]] = number[is_list]
    list_of = np.flatnonzero(is_list)
    list_owner = owner[list_of]
    try:
        owner, number, wire, xs, xe = scan_fields(buf, ls[list_of], le[list_of])
    except WireError as e:
        raise corrupt(record[list_owner[e.index]], 'not a tf.train.Example (bad wire format)')
    feature = list_owner[owner]  # Index into `chosen` of each value field.
    fkind = kind[feature]
    values_field = number == 1
    # Values: (feature index, byte position, value) for int64 and float lists.
    m = values_field & (fkind == 3) & (wire == 2)
    try:
        ints, region, at = packed_varints(buf, xs[m], xe[m])
    except WireError as e:
        raise corrupt(record[feature[np.flatnonzero(m)[e.index]]], 'a bad packed int64_list')
    int_feature, int_at = feature[m][region], at
    m = values_field & (fkind == 3) & (wire == 0)
    loose = read_varints(buf, xs[m], xe[m])[0].view(np.int64) if m.any() else ints[:0]
    int_feature = np.concatenate([int_feature, feature[m]])
    int_at = np.concatenate([int_at, xs[m]])
    ints = np.concatenate([ints, loose])
    m = values_field & (fkind == 2) & (wire == 2)
    if ((xe[m] - xs[m]) % 4).any():
        raise corrupt(record[feature[m][np.flatnonzero((xe[m] - xs[m]) % 4)[0]]],
                      'a packed float_list whose length is not a multiple of 4')
    m5 = values_field & (fkind == 2) & (wire == 5)
    fs_all = np.concatenate([xs[m], xs[m5]])
    fe_all = np.concatenate([xe[m], xe[m5]])
    fcount = (fe_all - fs_all) // 4
    float_feature = np.repeat(np.concatenate([feature[m], feature[m5]]), fcount)
    float_at = np.repeat(fs_all, fcount) + 4 * (np.arange(int(fcount.sum())) -
                                               np.repeat(np.cumsum(fcount) - fcount, fcount))
    floats = buf[float_at[:, None] + np.arange(4)].copy().view('<f4').reshape(-1)
    # Within each feature, values in the order of their bytes (as they
    # already are when every list is one packed field).
    if (np.diff(int_feature) < 0).any() or (np.diff(int_at)[np.diff(int_feature) == 0] < 0).any():
        order = np.lexsort((int_at, int_feature))
        int_feature, ints = int_feature[order], ints[order]
    if (np.diff(float_feature) < 0).any() or \
            (np.diff(float_at)[np.diff(float_feature) == 0] < 0).any():
        order = np.lexsort((float_at, float_feature))
        float_feature, floats = float_feature[order], floats[order]
    int_count = np.bincount(int_feature, minlength=len(chosen))
    float_count = np.bincount(float_feature, minlength=len(chosen))

    out = {'dense': {}, 'sparse': {}}
    slot_of = {key: s for s, key in enumerate(keys)}

    def entry_index(key):
        """Per record, the chosen entry of `key`, or -1."""
        return entry_of[:, slot_of[key]]

    def feature_name(key):
        return f'feature "{key}"'

    label = entry_index(layout['label_key'])
    if (label < 0).any():
        raise corrupt(np.flatnonzero(label < 0)[0],
                      f'the example has no label feature "{layout["label_key"]}"')
    if (kind[label] != 3).any() or (int_count[label] != 1).any():
        bad = np.flatnonzero((kind[label] != 3) | (int_count[label] != 1))[0]
        raise corrupt(bad, f'label feature "{layout["label_key"]}" is not one int64')
    int_first = np.cumsum(int_count) - int_count
    out['labels'] = ints[int_first[label]]
    if ((out['labels'] < 0) | (out['labels'] > 1)).any():
        bad = np.flatnonzero((out['labels'] < 0) | (out['labels'] > 1))[0]
        raise corrupt(bad, f'label {out["labels"][bad]} is not 0 or 1 (num_classes 2)')

    float_first = np.cumsum(float_count) - float_count
    for name, spec in layout['inputs'].items():
        if spec['sparse']:
            key = spec['features'][0]
            e = entry_index(key)
            has = e >= 0
            bad = np.flatnonzero(has & (kind[np.maximum(e, 0)] != 3) & (kind[np.maximum(e, 0)]
                                                                        != 0))
            if len(bad):
                raise corrupt(bad[0], f'input "{name}": {feature_name(key)} is not an '
                              'int64_list of ids')
            counts = np.where(has, int_count[np.maximum(e, 0)], 0)
            over = np.flatnonzero(counts > spec['max_ids'])
            if len(over):
                raise corrupt(over[0], f'input "{name}": {feature_name(key)} has '
                              f'{counts[over[0]]} ids; at most {spec["max_ids"]} (max_ids) are '
                              'allowed')
            firsts = np.repeat(np.where(has, int_first[np.maximum(e, 0)], 0), counts)
            within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            out['sparse'][name] = (ints[firsts + within], counts.astype(np.int32))
            continue
        parts, total = [], np.zeros(n, dtype=np.int64)
        for key in spec['features']:
            e = entry_index(key)
            if (e < 0).any():
                raise corrupt(np.flatnonzero(e < 0)[0],
                              f'input "{name}": the example has no {feature_name(key)}')
            kinds = kind[e]
            if ((kinds == 1)).any():
                raise corrupt(np.flatnonzero(kinds == 1)[0], f'input "{name}": '
                              f'{feature_name(key)} is a bytes_list; expected a float_list or '
                              'an int64_list')
            total += np.where(kinds == 2, float_count[e], np.where(kinds == 3, int_count[e], 0))
            parts.append((e, kinds))
        if (total != spec['width']).any():
            bad = np.flatnonzero(total != spec['width'])[0]
            raise corrupt(bad, f'input "{name}": features {", ".join(spec["features"])} hold '
                          f'{total[bad]} values; expected {spec["width"]}')
        values = np.zeros((n, spec['width']), dtype=np.float32)
        column = np.zeros(n, dtype=np.int64)
        for e, kinds in parts:
            for list_kind, count, firsts, source in ((2, float_count, float_first, floats),
                                                     (3, int_count, int_first, ints)):
                rows = np.flatnonzero(kinds == list_kind)
                c = count[e[rows]]
                r = np.repeat(rows, c)
                within = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
                values[r, column[r] + within] = source[firsts[e[rows]][np.repeat(
                    np.arange(len(rows)), c)] + within].astype(np.float32)
                column[rows] += c
        out['dense'][name] = values
    return out


def merge_distinct(parts):
    """Parts (distinct ids sorted, inverse: each id's index into them) as
    one: the distinct ids of all, and every part's inverse into them, one
    after another."""
    distinct = np.unique(np.concatenate([d for d, _ in parts]))
    inverse = [np.searchsorted(distinct, d).astype(np.int32)[i] for d, i in parts]
    return distinct, np.concatenate(inverse)


def parse_file(job):
    """One record file's examples (run in a pool's process); a sparse
    input's ids as (distinct ids, each id's index into them, counts), the
    distinct ids found here, in parallel, rather than over the whole set."""
    path, layout = job
    buf, starts, lengths = read_records(path)
    chunk = 1 << 12  # Records decoded at once: their arrays stay in the caches.
    parts = [decode_examples(buf, starts[i:i + chunk], lengths[i:i + chunk], layout, path, i)
             for i in range(0, len(starts), chunk)]
    if not parts:
        return None
    sparse = {}
    for k in parts[0]['sparse']:
        distinct, inverse = np.unique(np.concatenate([p['sparse'][k][0] for p in parts]),
                                      return_inverse=True)
        sparse[k] = (distinct, inverse.reshape(-1).astype(np.int32),
                     np.concatenate([p['sparse'][k][1] for p in parts]))
    return {
        'dense': {k: np.concatenate([p['dense'][k] for p in parts]) for k in parts[0]['dense']},
        'labels': np.concatenate([p['labels'] for p in parts]).astype(np.int8),
        'sparse': sparse,
    }


def parse_split(files, layout, processes):
    jobs = [(f, layout) for f in files]
    if processes > 1 and len(files) > 1:
        with multiprocessing.Pool(min(processes, len(files))) as pool:
            parts = pool.map(parse_file, jobs, chunksize=1)
    else:
        parts = [parse_file(j) for j in jobs]
    parts = [p for p in parts if p is not None]
    if not parts:
        raise InputError(f'{", ".join(files)} hold no examples')
    return {
        'dense': {k: np.concatenate([p['dense'][k] for p in parts]) for k in parts[0]['dense']},
        'labels': np.concatenate([p['labels'] for p in parts]),
        'sparse': {k: merge_distinct([p['sparse'][k][:2] for p in parts]) +
                   (np.concatenate([p['sparse'][k][2] for p in parts]),)
                   for k in parts[0]['sparse']},
    }


def table_rows(job, splits):
    """Each split's [n, tables, K] int32 rows (-1: no id) and each table's
    row count: with hash_ids the distinct ids of all splits in sorted order,
    else the ids themselves."""
    width = max(1, max(int(s['sparse'][t['input']][2].max(initial=0))
                       for s in splits for t in job['tables']))
    out = [np.full((len(s['labels']), len(job['tables']), width), -1, dtype=np.int32)
           for s in splits]
    counts = []
    for t, table in enumerate(job['tables']):
        codes = [s['sparse'][table['input']][:2] for s in splits]
        if table['hash_ids']:
            distinct, inverse = merge_distinct(codes)
            rows = np.split(inverse, np.cumsum([len(i) for _, i in codes])[:-1])
            counts.append(len(distinct))
        else:
            for d, _ in codes:
                if len(d) and (d[0] < 0 or d[-1] >= table['vocab_size']):
                    raise InputError(f'an id of table {table["name"]} is outside its vocab_size '
                                     f'{table["vocab_size"]} (set hash_ids to hash any id)')
            rows = [d[i] for d, i in codes]
            counts.append(table['vocab_size'])
        if sum(counts) >= 2**31 - 1:
            raise InputError('the tables hold more than 2^31 - 2 rows; too many for this baseline')
        for s, split in enumerate(splits):
            c = split['sparse'][table['input']][2].astype(np.int64)
            example = np.repeat(np.arange(len(c)), c)
            within = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
            out[s][example, t, within] = rows[s]
    return out, counts


CACHE_VERSION = 1


def load_data(job, data_dir, use_cache, processes):
    """(train, test, rows per table, cache note): each split a dict of
    'dense' {input: [n, width] float32}, 'labels' [n] int8, 'rows'
    [n, tables, K] int32."""
    files = {}
    for split in ('train', 'test'):
        pattern = job[f'{split}_files']
        if not pattern:
            raise InputError(f'the spec has no dataset.{split}_files')
        found = sorted(glob.glob(os.path.join(data_dir, pattern)))
        if not found:
            raise InputError(f'no {split} files match {os.path.join(data_dir, pattern)}')
        files[split] = found
    layout = {
        'inputs': {k: {f: v[f] for f in ('sparse', 'features', 'width', 'max_ids')}
                   for k, v in job['inputs'].items()},
        'label_key': job['label_key'],
    }
    layout['keys'] = sorted({f for i in layout['inputs'].values() for f in i['features']} |
                            {job['label_key']})
    stats = {s: [(os.path.basename(f), os.path.getsize(f), os.stat(f).st_mtime_ns)
                 for f in fs] for s, fs in files.items()}
    tables = [{k: t[k] for k in ('input', 'hash_ids', 'vocab_size')} for t in job['tables']]
    key = hashlib.sha1(json.dumps([CACHE_VERSION, stats, layout, tables],
                                  sort_keys=True).encode()).hexdigest()[:16]
    cache = os.path.join(os.path.dirname(files['train'][0]), 'pytorch_ctr.cache', key)
    names = [f'{s}_{part}' for s in ('train', 'test') for part in ('labels', 'rows')] + \
        [f'{s}_dense_{i}' for s in ('train', 'test') for i in job['inputs']
         if not job['inputs'][i]['sparse']]
    if use_cache and os.path.isfile(os.path.join(cache, 'meta.json')):
        meta = json.load(open(os.path.join(cache, 'meta.json')))
        arrays = {n: np.load(os.path.join(cache, n + '.npy')) for n in names}
        note = f'read the cache {cache}'
    else:
        splits = [parse_split(files[s], layout, processes) for s in ('train', 'test')]
        rows, counts = table_rows(job, splits)
        arrays, meta = {}, {'rows': counts}
        for s, split, r in zip(('train', 'test'), splits, rows):
            arrays[f'{s}_labels'] = split['labels']
            arrays[f'{s}_rows'] = r
            for i, values in split['dense'].items():
                arrays[f'{s}_dense_{i}'] = values
        note = 'parsed the record files'
        if use_cache:
            note += write_cache(cache, arrays, meta)
    out = []
    for s in ('train', 'test'):
        out.append({
            'labels': arrays[f'{s}_labels'], 'rows': arrays[f'{s}_rows'],
            'dense': {i: arrays[f'{s}_dense_{i}'] for i in job['inputs']
                      if not job['inputs'][i]['sparse']},
        })
    return out[0], out[1], meta['rows'], note, files


def write_cache(cache, arrays, meta):
    """Writes the cache whole or not at all; a note on what happened."""
    temporary = f'{cache}.tmp{os.getpid()}'
    try:
        os.makedirs(temporary, exist_ok=True)
        for name, array in arrays.items():
            np.save(os.path.join(temporary, name + '.npy'), array)
        with open(os.path.join(temporary, 'meta.json'), 'w') as f:
            json.dump(meta, f)
        os.replace(temporary, cache)
        return f', cached in {cache}'
    except OSError as e:
        shutil.rmtree(temporary, ignore_errors=True)
        return f' (not cached: {cache}: {e.strerror})'


def bayes_figures(files):
    """The generator's test-set Bayes AUC and log loss, from its summary
    beside the data (downpourctl dataset generate writes NAME.json)."""
    folder = os.path.dirname(files['test'][0])
    for path in sorted(glob.glob(os.path.join(folder, '*.json'))):
        try:
            summary = json.load(open(path))
        except (OSError, ValueError):
            continue
        if isinstance(summary, dict) and summary.get('kind') == 'ctr':
            test = summary.get('test', {})
            return test.get('bayes_auc'), test.get('bayes_log_loss')
    return None, None


# ---------------------------------------------------------------- model

def auc_and_log_loss(torch, p, y):
    """Exact AUC (ties count one half) and mean log loss (probability of the
    label's class clamped to 1e-15), p and y float64 on one device."""
    order = torch.argsort(p)
    ps, ys = p[order], y[order]
    _, inverse, counts = torch.unique_consecutive(ps, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    ranks = (ends - (counts.double() - 1) / 2)[inverse]  # 1-based mean rank of each tie group
    positives = ys.sum()
    negatives = ys.numel() - positives
    auc = ((ranks * ys).sum() - positives * (positives + 1) / 2) / (positives * negatives)
    chosen = torch.where(y > 0, p, 1 - p).clamp_min(1e-15)
    return float(auc), float(-torch.log(chosen).mean())


def build(torch, job, table_counts, device, seed):
    nn = torch.nn

    class RowwiseTables:
        """Every sparse table in one [rows + 1, dim] array (the last row:
        zeros, what padding reads), each row with its own optimizer state;
        a step updates only the rows its batch touched (ps/sparse_table.cc's
        Apply), through a gradient of the whole array with the untouched
        rows masked (`masked`) or through the batch's distinct rows."""

        def __init__(self, tables, counts, masked):
            self.dim = tables[0]['dim']
            self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            self.rows = int(self.offsets[-1])
            self.opt = tables[0]['optimizer']
            self.masked = masked
            g = torch.Generator(device='cpu')
            g.manual_seed(seed + 1)
            values = torch.empty(self.rows + 1, self.dim)
            for t, table in enumerate(tables):
                s = table['init_scale']
                values[self.offsets[t]:self.offsets[t + 1]].uniform_(-s, s, generator=g)
            values[self.rows] = 0
            self.values = values.to(device)
            kind = self.opt['kind']
            slots = {'ADAM': 2, 'ADAGRAD': 1}.get(kind, 0)
            if kind == 'MOMENTUM':
                raise InputError('sparse tables offer no MOMENTUM (spec/model_shape.h)')
            self.slots = [torch.zeros_like(self.values) for _ in range(slots)]
            self.updates = torch.zeros(self.rows + 1, dtype=torch.int64, device=device)
            # Downpour's hyperparameters are floats; its bias corrections
            # take them in double.
            self.b1 = float(np.float32(self.opt['beta1']))
            self.b2 = float(np.float32(self.opt['beta2']))

        def pool(self, rows, weights):
            """[B, T, K] rows and their weights -> [B, T, dim]."""
            b, t, k = rows.shape
            return torch.nn.functional.embedding_bag(
                rows.reshape(b * t, k), self.values, per_sample_weights=weights.reshape(b * t, k),
                mode='sum').reshape(b, t, self.dim)

        def apply(self, rows, weights, pooled_grad):
            grads = (pooled_grad.unsqueeze(2) * weights.unsqueeze(-1)).reshape(-1, self.dim)
            flat = rows.reshape(-1)
            if self.masked:
                grad = torch.zeros_like(self.values).index_add_(0, flat, grads)
                touched = torch.zeros(self.rows + 1, dtype=torch.bool, device=self.values.device)
                touched[flat] = True
                touched[self.rows] = False
                self._update(slice(None), grad, touched)
            else:
                distinct, inverse = torch.unique(flat, return_inverse=True)
                grad = torch.zeros(distinct.numel(), self.dim, device=self.values.device)
                grad.index_add_(0, inverse, grads)
                self._update(distinct, grad, None)
                # The padding row (when the batch had padding) stays zero.
                self.values[self.rows] = 0
                for s in self.slots:
                    s[self.rows] = 0
                self.updates[self.rows] = 0

        def _update(self, at, grad, touched):
            o = self.opt
            p = self.values[at]
            t = self.updates[at] + (touched if touched is not None else 1)
            g = grad + o['weight_decay'] * p if o['weight_decay'] else grad
            lr = float(np.float32(o['lr']))
            if o['kind'] == 'ADAM':
                m = self.b1 * self.slots[0][at] + (1 - self.b1) * g
                v = self.b2 * self.slots[1][at] + (1 - self.b2) * g * g
                td = t.clamp_min(1).double()
                step_size = (lr / (1 - torch.pow(self.b1, td))).float().unsqueeze(1)
                inv_bc2 = (1 / torch.sqrt(1 - torch.pow(self.b2, td))).float().unsqueeze(1)
                new = p - step_size * m / (torch.sqrt(v) * inv_bc2 + o['epsilon'])
                news = [m, v]
            elif o['kind'] == 'ADAGRAD':
                a = self.slots[0][at] + g * g
                new = p - lr * g / (torch.sqrt(a) + o['epsilon'])
                news = [a]
            else:
                new = p - lr * g
                news = []
            if touched is not None:
                keep = touched.unsqueeze(1)
                new = torch.where(keep, new, p)
                news = [torch.where(keep, n, s) for n, s in zip(news, self.slots)]
            self.values[at] = new
            for s, n in zip(self.slots, news):
                s[at] = n
            self.updates[at] = t

    table_of = {l['name']: l['table'] for l in job['layers'] if l['kind'] == 'embedding'}

    def segments(names):
        """A layer's inputs as runs: ('table', t0, t1) for embeddings of the
        consecutive tables t0..t1-1 (one slice of the pooled rows, so one
        copy forward and one gradient back instead of one per table), else
        ('output', name)."""
        out = []
        for name in names:
            t = table_of.get(name)
            if t is not None and out and out[-1][0] == 'table' and out[-1][2] == t:
                out[-1] = ('table', out[-1][1], t + 1)
            elif t is not None:
                out.append(('table', t, t + 1))
            else:
                out.append(('output', name))
        return out

    class SpecModel(nn.Module):
        """The job spec's layers, in order, each reading the outputs named
        by its inputs; embedding layers read the pooled rows."""

        def __init__(self):
            super().__init__()
            self.layers = job['layers']
            self.segments = {l['name']: segments(l['inputs']) for l in self.layers}
            self.dense = nn.ModuleDict()
            self.pairs = {}
            g = torch.Generator(device='cpu')
            g.manual_seed(seed)
            for layer in self.layers:
                if layer['kind'] == 'dense':
                    linear = nn.Linear(layer['in'], layer['units'], bias=layer['bias'])
                    with torch.no_grad():
                        limit = math.sqrt(6.0 / layer['in'])
                        linear.weight.uniform_(-limit, limit, generator=g)
                        if linear.bias is not None:
                            linear.bias.zero_()
                    self.dense[layer['name']] = linear
                elif layer['kind'] == 'dot_interaction':
                    k = len(layer['inputs'])
                    self.pairs[layer['name']] = torch.triu_indices(k, k, offset=1).to(device)

        def forward(self, dense_inputs, pooled):
            out = dict(dense_inputs)
            for layer in self.layers:
                kind = layer['kind']
                xs = [out.get(i) for i in layer['inputs'][:1]]
                if kind == 'dense':
                    y = self.dense[layer['name']](xs[0])
                elif kind == 'relu':
                    y = torch.relu(xs[0])
                elif kind == 'embedding':
                    y = pooled[:, layer['table']]
                elif kind == 'concat':
                    y = torch.cat([out[s[1]] if s[0] == 'output' else
                                   pooled[:, s[1]:s[2]].reshape(pooled.shape[0], -1)
                                   for s in self.segments[layer['name']]], dim=1)
                elif kind == 'dot_interaction':
                    z = torch.cat([out[s[1]].unsqueeze(1) if s[0] == 'output' else
                                   pooled[:, s[1]:s[2]] for s in self.segments[layer['name']]],
                                  dim=1)
                    i, j = self.pairs[layer['name']]
                    y = torch.bmm(z, z.transpose(1, 2))[:, i, j]
                else:  # softmax_cross_entropy: its input is the logits.
                    return xs[0]
                out[layer['name']] = y
            raise AssertionError('the spec has no loss layer')

    return SpecModel().to(device), RowwiseTables


def dense_optimizer(torch, params, o, cuda):
    lr = o['lr']
    if o['kind'] == 'ADAM':
        return torch.optim.Adam(params, lr=lr, betas=(o['beta1'], o['beta2']), eps=o['epsilon'],
                                weight_decay=o['weight_decay'], fused=cuda)
    if o['kind'] == 'ADAGRAD':
        return torch.optim.Adagrad(params, lr=lr, eps=o['epsilon'],
                                   weight_decay=o['weight_decay'])
    return torch.optim.SGD(params, lr=lr, weight_decay=o['weight_decay'],
                           momentum=o['momentum'] if o['kind'] == 'MOMENTUM' else 0.0)


# ---------------------------------------------------------------- main

def parse_args():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--data', required=True,
                   help="the folder the spec's train_files and test_files are relative to (a "
                   "worker's --data_dir)")
    p.add_argument('--spec', default=os.path.join(here, '..', 'examples', 'ctr_dlrm.pbtxt'))
    p.add_argument('--workers', type=int, default=None,
                   help="a step's batch is batch_size x WORKERS (default: the spec's num_workers)")
    p.add_argument('--steps', type=int, default=None, help="default: the spec's steps")
    p.add_argument('--eval_every', type=int, default=None,
                   help="steps between evaluations (default: the spec's eval_every_steps; 0: "
                   "only at the end)")
    p.add_argument('--device', choices=['cuda', 'cpu'], default='cuda')
    p.add_argument('--precision', choices=['fp32', 'bf16'], default=None,
                   help="default: the spec's (fp32 unless it says BF16)")
    p.add_argument('--seed', type=int, default=None, help="default: the spec's seed")
    p.add_argument('--warmup_steps', type=int, default=20,
                   help='first steps left out of the steady-state examples/s')
    p.add_argument('--sparse_update', choices=['auto', 'masked', 'distinct'], default='auto',
                   help="the rows' update: over the whole array, untouched rows masked "
                   "(masked), or over the batch's distinct rows (distinct); auto: masked for "
                   "tables of at most 2^24 values")
    p.add_argument('--eval_batch', type=int, default=65536)
    p.add_argument('--no_cache', action='store_true',
                   help='parse the record files every time; write no cache')
    p.add_argument('--processes', type=int, default=os.cpu_count() or 1,
                   help='processes parsing record files (default: the cores)')
    a = p.parse_args()
    for flag in ('workers', 'steps', 'eval_batch', 'processes'):
        value = getattr(a, flag)
        if value is not None and value < 1:
            die(f'--{flag}={value} must be at least 1')
    if a.eval_every is not None and a.eval_every < 0:
        die(f'--eval_every={a.eval_every} must not be negative')
    if a.warmup_steps < 0:
        die(f'--warmup_steps={a.warmup_steps} must not be negative')
    if not os.path.isdir(a.data):
        die(f'--data {a.data} is not a folder')
    return a


def main():
    a = parse_args()
    try:
        job = read_job(a.spec)
    except InputError as e:
        die(str(e))
    try:
        import torch
    except ImportError as e:
        die(f'PyTorch is not installed for {sys.executable} ({e}); install torch or run a Python '
            'that has it')
    if a.device == 'cuda' and not torch.cuda.is_available():
        die(f'CUDA is not available to PyTorch {torch.__version__} (built for CUDA '
            f'{torch.version.cuda}); run on a GPU machine, or pass --device cpu')
    workers = a.workers or job['num_workers']
    batch = job['batch_size'] * workers
    steps = a.steps or job['steps']
    eval_every = job['eval_every_steps'] if a.eval_every is None else a.eval_every
    seed = job['seed'] if a.seed is None else a.seed
    precision = a.precision or {'FP32': 'fp32', 'BF16': 'bf16'}.get(job['precision'])
    if precision is None:
        die(f"{a.spec}: precision {job['precision']} is not modelled by this baseline; pass "
            '--precision fp32 or bf16')
    if batch < 1 or steps < 1:
        die(f'{a.spec}: dataset.batch_size and steps must be positive (or pass --steps)')

    loading = time.time()
    try:
        train, test, counts, note, files = load_data(job, a.data, not a.no_cache, a.processes)
    except InputError as e:
        die(str(e))
    bayes_auc, bayes_log_loss = bayes_figures(files)
    device = torch.device(a.device)
    cuda = device.type == 'cuda'
    torch.manual_seed(seed)
    sentinel = int(sum(counts))
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(counts)[:-1]]), dtype=torch.int32)

    def to_device(split):
        rows = torch.from_numpy(np.ascontiguousarray(split['rows'])).to(device)
        # Each table's rows after the tables before it; no id: the zero row.
        rows = torch.where(rows >= 0, rows + offsets.to(device).view(1, -1, 1),
                           torch.tensor(sentinel, dtype=torch.int32, device=device))
        return {
            'rows': rows,
            'labels': torch.from_numpy(split['labels'].astype(np.int64)).to(device),
            'dense': {k: torch.from_numpy(v).to(device) for k, v in split['dense'].items()},
            'n': len(split['labels']),
        }

    train, test = to_device(train), to_device(test)
    mean = torch.tensor([t['mean'] for t in job['tables']], device=device).view(1, -1)
    model, RowwiseTables = build(torch, job, counts, device, seed)
    masked = a.sparse_update == 'masked' or (a.sparse_update == 'auto' and
                                             (sentinel + 1) * job['tables'][0]['dim'] <= 1 << 24)
    tables = RowwiseTables(job['tables'], counts, masked)
    opt = dense_optimizer(torch, model.parameters(), job['optimizer'], cuda)
    autocast = precision == 'bf16'
    loss_fn = torch.nn.CrossEntropyLoss()
    dense_names = list(train['dense'])

    def batch_of(split, idx):
        rows = split['rows'][idx].long()
        present = rows != sentinel
        count = present.sum(-1, keepdim=True).clamp_min(1)
        weights = present.float() * torch.where(mean.unsqueeze(-1), 1.0 / count.float(), 1.0)
        return rows, weights, {k: split['dense'][k][idx] for k in dense_names}

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def evaluate():
        scores, correct = [], 0
        with torch.no_grad():
            for i in range(0, test['n'], a.eval_batch):
                idx = torch.arange(i, min(i + a.eval_batch, test['n']), device=device)
                rows, weights, dense = batch_of(test, idx)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                    logits = model(dense, tables.pool(rows, weights)).float()
                # As the workers score: P(1) = sigmoid(logit 1 - logit 0),
                # the difference taken in float.
                scores.append(torch.sigmoid((logits[:, 1] - logits[:, 0]).double()))
                correct += int((logits.argmax(1) == test['labels'][idx]).sum())
        p = torch.cat(scores)
        auc, log_loss = auc_and_log_loss(torch, p, test['labels'].double())
        return auc, log_loss, correct / test['n']

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    load_s = time.time() - loading
    print(json.dumps({'loaded': {'train': train['n'], 'test': test['n'], 'rows': sentinel,
                                 'ids_per_example_max': int(train['rows'].shape[2]),
                                 'seconds': round(load_s, 3), 'how': note}}), flush=True)

    # The clock starts here. Training time is measured in windows that end
    # where the device is synchronised anyway: at the end of the warm-up,
    # before each evaluation and at the end.
    sync()
    began = window = time.time()
    window_step = 0
    order, at = torch.randperm(train['n'], generator=g, device=device), 0
    train_s = steady_s = eval_s = 0.0
    steady_examples = 0
    result = None
    for step in range(1, steps + 1):
        if at + batch > train['n']:
            # Every batch is full: the epoch's last examples start the next.
            fresh = torch.randperm(train['n'], generator=g, device=device)
            order, at = torch.cat([order[at:], fresh]), 0
        idx = order[at:at + batch]
        at += batch
        rows, weights, dense = batch_of(train, idx)
        with torch.no_grad():
            pooled = tables.pool(rows, weights)
        pooled.requires_grad_(True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(dense, pooled)
        loss = loss_fn(logits.float(), train['labels'][idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            tables.apply(rows, weights, pooled.grad)
        evaluates = (eval_every > 0 and step % eval_every == 0) or step == steps
        if step == a.warmup_steps or evaluates:
            sync()
            now = time.time()
            train_s += now - window
            if window_step >= a.warmup_steps:
                steady_s += now - window
                steady_examples += (step - window_step) * batch
            window, window_step = now, step
        if evaluates:
            auc, log_loss, accuracy = evaluate()
            sync()
            now = time.time()
            eval_s += now - window
            window = now
            rate = steady_examples / steady_s if steady_s > 0 else step * batch / train_s
            result = (auc, log_loss, accuracy)
            print(json.dumps({'eval': step, 'examples_per_s': round(rate, 1), 'auc': auc,
                              'log_loss': log_loss, 't_s': round(now - began, 3)}), flush=True)
    total_s = time.time() - began
    auc, log_loss, accuracy = result
    print(json.dumps({
        'system': 'pytorch', 'model': job['name'],
        'device': torch.cuda.get_device_name(device) if cuda else f'cpu ({os.cpu_count()} cores, '
        f'{torch.get_num_threads()} threads)',
        'precision': precision, 'workers': workers, 'batch': batch, 'steps': steps,
        'examples_per_s': round(steady_examples / steady_s, 1) if steady_s > 0 else None,
        'examples_per_s_all_steps': round(steps * batch / train_s, 1),
        'total_s': round(total_s, 3), 'train_s': round(train_s, 3), 'eval_s': round(eval_s, 3),
        'load_s': round(load_s, 3),
        'auc': auc, 'log_loss': log_loss, 'accuracy': accuracy,
        'bayes_auc': bayes_auc, 'bayes_log_loss': bayes_log_loss,
        'details': {'train_examples': train['n'], 'test_examples': test['n'], 'rows': sentinel,
                    'sparse_update': 'masked' if masked else 'distinct',
                    'warmup_steps': a.warmup_steps, 'seed': seed, 'torch': torch.__version__,
                    'spec': a.spec, 'consistency': job['consistency']},
    }), flush=True)


if __name__ == '__main__':
    main()
