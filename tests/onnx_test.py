"""Models come into Downpour as ONNX graphs and leave it as ONNX graphs that
ONNX Runtime runs.

Starts the real daemons on loopback with a checkpoint root (one coordinator,
two shards, two workers; export_numpy_test.Cluster), trains three short jobs
and exports each with `downpourctl export --format=onnx`, as a user would:

  mlp     examples/fashion_mnist_mlp.pbtxt, 300 steps (flatten of an image,
          dense layers);
  cnn_bn  a CNN over Fashion-MNIST with batch norm, a residual add, max and
          average pools with asymmetric SAME padding, a concat of images,
          global average pooling, a flatten, dropout and a concat of vectors;
  ctr     a click model with two named dense inputs, dot_interaction, a
          concat and batch norm over vectors, on `dataset generate --kind=ctr`
          data (metrics ACCURACY and AUC);
  sparse  a model with a sparse embedding, trained a few steps: its export
          is refused with exit status 2 and one sentence naming the layer.

and models written by PyTorch's exporters (tests/data/onnx, made by
bench/onnx_models.py: a small ResNet with batch norm, a residual block and a
global average pool) go in with `downpourctl submit --model=F.onnx`:

  import_identity  the dynamo exporter's file (a model trained 300 steps in
          PyTorch; weights in F.onnx.data beside it; batch norm folded into
          the convolutions), trained one step at
          a learning rate of 1e-9: the job's test accuracy must be ONNX
          Runtime's on the original file, to 2 examples of 10000 (the
          import's layouts, paddings and weights are the graph's);
  import_train  the TorchScript exporter's file (batch norm kept), trained
          300 steps and exported as ONNX: ONNX Runtime reaches the job's
          accuracy (1e-6), and the exported safetensors file holds exactly
          the PyTorch module's state_dict keys (F.keys.json), so
          load_state_dict(strict=True) takes it;
  import_refused  a graph with a Sigmoid (written with the onnx package's
          helper): `model import` and `submit --model` exit 2 naming the
          node and its op;
  import_ops  a small graph per supported op (docs/job-specs.md's table) and
          per refusal, written by the onnx package's helper and checked by
          onnx.checker: `model import` maps each to the documented layers
          or exits 2 with the documented sentence.

Each file passes onnx.checker.check_model (full_check: ONNX's shape
inference agrees with the declared shapes), and ONNX Runtime, fed the job's
own test records (decoded here from their tf.Example bytes, pixels scaled by
float32(1/255) as data/example.cc does, transposed from HWC to NCHW), must
reach the accuracy the job reported (`downpourctl get -o json`) to 1e-6:
rank 0 evaluates the whole test set with the exported checkpoint's
parameters and batch-norm statistics, so the two count the same examples
right unless a rounding difference flips a near-tie. The ctr job's AUC must
agree to 1e-4 (a rounding difference may reorder two near-equal scores).

Run by scripts/test.sh with the venv of scripts/python-deps.sh (onnx,
onnxruntime, NumPy), after the build; skipped, with the reason, without them.
Writes JUnit XML for scripts/count_tests.py.
usage: onnx_test.py --bin BAZEL_BIN --junit OUT.xml
"""
import argparse
import glob
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_numpy_test import ROOT, Cluster, run_cases  # noqa: E402

ACCURACY_TOLERANCE = 1e-6
AUC_TOLERANCE = 1e-4
STEPS = 300

CNN_BN = """
name: "onnx-cnn-bn"
model {
  input_shape: [28, 28, 1]
  num_classes: 10
  layer { name: "conv1" conv2d { filters: 8 kernel_size: 3 no_bias: true } }
  layer { name: "bn1" batch_norm {} }
  layer { name: "relu1" relu {} }
  layer { name: "pool1" max_pool { window: 2 } }
  layer { name: "conv2" conv2d { filters: 8 kernel_size: 3 } }
  layer { name: "bn2" batch_norm { epsilon: 0.001 momentum: 0.9 } }
  layer { name: "relu2" relu {} }
  layer { name: "res" inputs: ["pool1", "relu2"] add {} }
  layer { name: "maxp" max_pool { window: 3 stride: 2 } }
  layer { name: "avgp" inputs: "res" avg_pool { window: 3 stride: 2 } }
  layer { name: "cat" inputs: ["maxp", "avgp"] concat {} }
  layer { name: "gap" global_avg_pool {} }
  layer { name: "flat" inputs: "cat" flatten {} }
  layer { name: "fc" dense { units: 32 } }
  layer { name: "relu3" relu {} }
  layer { name: "drop" dropout { rate: 0.1 } }
  layer { name: "head" inputs: ["gap", "drop"] concat {} }
  layer { name: "logits" dense { units: 10 } }
  layer { name: "loss" softmax_cross_entropy {} }
}
dataset {
  train_files: "fashion-mnist/train-*.tfrecord"
  test_files: "fashion-mnist/test-*.tfrecord"
  batch_size: 64
  shuffle_buffer: 10000
}
optimizer { kind: ADAM learning_rate: 0.002 }
consistency { mode: SYNC }
num_workers: 2
num_shards: 2
steps: %d
seed: 1
""" % STEPS

CTR = """
name: "onnx-ctr"
model {
  num_classes: 2
  inputs { name: "low" features: ["I1", "I2", "I3", "I4", "I5", "I6"] }
  inputs { name: "high" features: ["I7", "I8", "I9", "I10", "I11", "I12", "I13"] }
  layer { name: "bottom_low" inputs: "low" dense { units: 8 } }
  layer { name: "relu_low" relu {} }
  layer { name: "bottom_high" inputs: "high" dense { units: 8 } }
  layer { name: "relu_high" relu {} }
  layer { name: "dot" inputs: ["relu_low", "relu_high", "bottom_low"] dot_interaction {} }
  layer { name: "top" inputs: ["relu_low", "relu_high", "dot"] concat {} }
  layer { name: "bn" batch_norm {} }
  layer { name: "logits" dense { units: 2 } }
  layer { name: "loss" softmax_cross_entropy {} }
}
dataset {
  train_files: "ctr/ctr-train-*.tfrecord"
  test_files: "ctr/ctr-test-*.tfrecord"
  batch_size: 256
}
optimizer { kind: ADAM learning_rate: 0.01 }
consistency { mode: SYNC }
metrics: [ACCURACY, AUC]
num_workers: 2
num_shards: 2
steps: %d
seed: 1
""" % STEPS

SPARSE = """
name: "onnx-sparse"
model {
  num_classes: 2
  inputs { name: "C1" kind: SPARSE max_ids: 8 }
  layer { name: "emb" inputs: "C1" embedding { sparse: true hash_ids: true dim: 4 } }
  layer { name: "logits" dense { units: 2 } }
  layer { name: "loss" softmax_cross_entropy {} }
}
dataset {
  train_files: "ctr/ctr-train-*.tfrecord"
  test_files: "ctr/ctr-test-*.tfrecord"
  batch_size: 256
}
optimizer { kind: ADAM learning_rate: 0.01 }
num_workers: 1
num_shards: 2
steps: 20
"""


# ------------------------------------------------ records and tf.Example


def read_records(pattern):
    """Every record's payload in the files matching `pattern`, in file
    order. The CRCs are not checked: the job just read the same files, and
    its reader checks them."""
    records = []
    for path in sorted(glob.glob(pattern)):
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack_from("<Q", data, pos)
            records.append(data[pos + 12 : pos + 12 + length])
            pos += 16 + length
    if not records:
        raise RuntimeError(f"no records in {pattern}")
    return records


def _varint(buf, pos):
    value, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(buf):
    """(field number, wire type, value) of a message: an int for a varint,
    bytes for the others."""
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"wire type {wire} in a tf.Example")
        yield number, wire, value


def _feature(buf):
    """A tf.train.Feature: a list of bytes, floats or ints."""
    values = []
    for kind, _, holder in _fields(buf):
        for number, wire, v in _fields(holder):
            if number != 1:
                continue
            if kind == 1:  # bytes_list
                values.append(v)
            elif kind == 2:  # float_list, packed or not
                values.extend(struct.unpack(f"<{len(v) // 4}f", v))
            elif wire == 0:  # int64_list, one value
                values.append(v - (1 << 64) if v >= 1 << 63 else v)
            else:  # int64_list, packed
                pos = 0
                while pos < len(v):
                    x, pos = _varint(v, pos)
                    values.append(x - (1 << 64) if x >= 1 << 63 else x)
    return values


def parse_example(buf):
    """A tf.train.Example's features by name."""
    features = {}
    for number, _, message in _fields(buf):
        if number != 1:
            continue
        for entry_number, _, entry in _fields(message):
            if entry_number != 1:
                continue
            key, value = None, b""
            for n, _, v in _fields(entry):
                if n == 1:
                    key = v.decode()
                elif n == 2:
                    value = v
            features[key] = _feature(value)
    return features


def image_test_set(data_dir):
    """Fashion-MNIST's test records as NCHW float32 images and labels."""
    import numpy as np

    images, labels = [], []
    for record in read_records(os.path.join(data_dir, "fashion-mnist", "test-*.tfrecord")):
        example = parse_example(record)
        images.append(np.frombuffer(example["image"][0], np.uint8))
        labels.append(example["label"][0])
    # data/example.cc: raw bytes times float(1.0f / 255.0f).
    pixels = np.stack(images).astype(np.float32) * np.float32(1.0 / 255.0)
    nchw = pixels.reshape(-1, 28, 28, 1).transpose(0, 3, 1, 2)
    return {"input": np.ascontiguousarray(nchw)}, np.array(labels)


def ctr_test_set(data_dir):
    """The click log's test records: the two named inputs, and labels."""
    import numpy as np

    low, high, labels = [], [], []
    for record in read_records(os.path.join(data_dir, "ctr", "ctr-test-*.tfrecord")):
        example = parse_example(record)
        low.append([example[f"I{j}"][0] for j in range(1, 7)])
        high.append([example[f"I{j}"][0] for j in range(7, 14)])
        labels.append(example["label"][0])
    return ({"low": np.array(low, np.float32), "high": np.array(high, np.float32)},
            np.array(labels))


# --------------------------------------------------------------- checks


def auc(scores, labels):
    """The area under the ROC curve, ties counting one half (as
    common/binary_metrics.cc)."""
    import numpy as np

    order = np.argsort(scores, kind="stable")
    s, y = scores[order], labels[order]
    ranks = np.empty(len(s))
    start = 0
    while start < len(s):  # Average ranks over runs of equal scores.
        end = start
        while end + 1 < len(s) and s[end + 1] == s[start]:
            end += 1
        ranks[start : end + 1] = (start + end) / 2 + 1
        start = end + 1
    positives = int(y.sum())
    negatives = len(y) - positives
    return (ranks[y == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives)


def run_onnx(path, inputs):
    """Logits and probabilities of every example, in batches of 1000."""
    import numpy as np
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    if sorted(names) != sorted(inputs):
        raise AssertionError(f"{path} takes inputs {names}, not {sorted(inputs)}")
    outputs = [o.name for o in session.get_outputs()]
    if outputs != ["logits", "probabilities"]:
        raise AssertionError(f"{path} has outputs {outputs}, not logits and probabilities")
    n = len(next(iter(inputs.values())))
    logits, probabilities = [], []
    for at in range(0, n, 1000):
        got = session.run(None, {k: v[at : at + 1000] for k, v in inputs.items()})
        logits.append(got[0])
        probabilities.append(got[1])
    return np.concatenate(logits), np.concatenate(probabilities)


def check_onnx_export(cluster, name, spec_path, test_set):
    import numpy as np
    import onnx

    cluster.ctl("submit", spec_path, "--job_id=" + name, "--wait")
    job = json.loads(cluster.ctl("-o", "json", "get", name))
    out = os.path.join(cluster.work, name + ".onnx")
    printed = cluster.ctl("export", name, "--format=onnx", "--out=" + out)
    if not re.match(rf"wrote {re.escape(out)} \(ONNX opset 17, [0-9.]+ MiB\) from job {name} "
                    rf"step {STEPS}", printed):
        raise AssertionError(f"export printed {printed.strip()!r}")
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    if model.ir_version != 8 or [(o.domain, o.version) for o in model.opset_import] != [("", 17)]:
        raise AssertionError(f"{out}: IR version {model.ir_version}, opsets "
                             f"{[(o.domain, o.version) for o in model.opset_import]}")
    inputs, labels = test_set
    logits, probabilities = run_onnx(out, inputs)
    if not np.allclose(probabilities.sum(axis=1), 1, atol=1e-5):
        raise AssertionError(f"{name}: probabilities do not sum to 1")
    ours = float((logits.argmax(axis=1) == labels).mean())
    theirs = job["test_accuracy"]
    report = f"{name}: job test accuracy {theirs:.6f}, ONNX Runtime {ours:.6f}"
    failures = []
    if abs(ours - theirs) > ACCURACY_TOLERANCE:
        failures.append(f"ONNX Runtime's accuracy {ours:.6f} is not the job's {theirs:.6f}")
    if "test_auc" in job:
        ours_auc = auc(probabilities[:, 1], labels)
        report += f"; job AUC {job['test_auc']:.6f}, ONNX Runtime {ours_auc:.6f}"
        if abs(ours_auc - job["test_auc"]) > AUC_TOLERANCE:
            failures.append(f"ONNX Runtime's AUC {ours_auc:.6f} is not within "
                            f"{AUC_TOLERANCE} of the job's {job['test_auc']:.6f}")
    print(report, flush=True)
    if failures:
        raise AssertionError(f"{name}: " + "; ".join(failures))


def check_refused(cluster, name, spec_path, _):
    cluster.ctl("submit", spec_path, "--job_id=" + name, "--wait")
    out = os.path.join(cluster.work, name + ".onnx")
    result = subprocess.run([cluster.ctl_path, "--coordinator=" + cluster.coordinator, "export",
                             name, "--format=onnx", "--out=" + out],
                            capture_output=True, text=True, timeout=300)
    expected = (f'downpourctl: job {name}: layer "emb" (embedding): sparse tables have no ONNX '
                "form in this exporter; export --format=safetensors\n")
    if result.returncode != 2 or result.stderr != expected or os.path.exists(out):
        raise AssertionError(f"export of {name} exited {result.returncode} with "
                             f"{result.stderr!r}; expected 2 with {expected!r} and no file")
    print(f"{name}: refused: {result.stderr.strip()}", flush=True)


FIXTURES = os.path.join(ROOT, "tests", "data", "onnx")
TRAINING_PART = """
dataset {
  train_files: "fashion-mnist/train-*.tfrecord"
  test_files: "fashion-mnist/test-*.tfrecord"
  batch_size: 64
  shuffle_buffer: 10000
}
optimizer { kind: %s learning_rate: %g }
consistency { mode: SYNC }
num_workers: 2
num_shards: 2
steps: %d
seed: 1
"""


def ort_accuracy(path, images, labels):
    """ONNX Runtime's accuracy of the graph in `path` (one input, the
    logits first among its outputs)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    right = 0
    for at in range(0, len(labels), 1000):
        logits = session.run(None, {name: images[at : at + 1000]})[0]
        right += int((logits.argmax(axis=1) == labels[at : at + 1000]).sum())
    return right / len(labels)


def submit_model(cluster, name, onnx_file, optimizer, rate, steps):
    spec_path = os.path.join(cluster.work, name + ".pbtxt")
    with open(spec_path, "w") as f:
        f.write(TRAINING_PART % (optimizer, rate, steps))
    cluster.ctl("submit", spec_path, "--model=" + onnx_file, "--job_id=" + name, "--wait")
    return json.loads(cluster.ctl("-o", "json", "get", name))


def check_import_identity(cluster, name, _, test_set):
    onnx_file = os.path.join(FIXTURES, "dynamo", "small_resnet.onnx")
    job = submit_model(cluster, name, onnx_file, "SGD", 1e-9, 1)
    inputs, labels = test_set
    theirs = ort_accuracy(onnx_file, inputs["input"], labels)
    if theirs < 0.5:
        raise AssertionError(f"{onnx_file} predicts too little ({theirs}) to tell anything")
    print(f"{name}: ONNX Runtime on {os.path.relpath(onnx_file, ROOT)} {theirs:.4f}, "
          f"the job from it {job['test_accuracy']:.4f}", flush=True)
    if abs(theirs - job["test_accuracy"]) > 2 / len(labels):
        raise AssertionError(f"{name}: the imported model's accuracy {job['test_accuracy']:.4f} "
                             f"is not ONNX Runtime's {theirs:.4f} on the file")


def check_import_train(cluster, name, _, test_set):
    from safetensors.numpy import load_file

    onnx_file = os.path.join(FIXTURES, "torchscript", "small_resnet.onnx")
    imported = os.path.join(cluster.work, name + "-model.pbtxt")
    printed = cluster.ctl("model", "import", onnx_file, "--out=" + imported)
    if "PyTorch layout" not in printed or not os.path.exists(imported[:-6] + ".safetensors"):
        raise AssertionError(f"model import printed {printed.strip()!r}")
    job = submit_model(cluster, name, onnx_file, "ADAM", 0.005, STEPS)
    out = os.path.join(cluster.work, name + ".onnx")
    cluster.ctl("export", name, "--format=onnx", "--out=" + out)
    inputs, labels = test_set
    ours = ort_accuracy(out, inputs["input"], labels)
    print(f"{name}: job test accuracy {job['test_accuracy']:.6f}, ONNX Runtime on its export "
          f"{ours:.6f}", flush=True)
    if abs(ours - job["test_accuracy"]) > ACCURACY_TOLERANCE or job["test_accuracy"] < 0.75:
        raise AssertionError(f"{name}: ONNX Runtime {ours:.6f}, the job {job['test_accuracy']}")
    weights = os.path.join(cluster.work, name + ".safetensors")
    cluster.ctl("export", name, "--out=" + weights)
    # The PyTorch module's state_dict keys (bench/onnx_models.py wrote them):
    # what load_state_dict(strict=True) takes. The graph alone does not have
    # them all: the exporter shares equal initializers between layers.
    with open(onnx_file[: -len(".onnx")] + ".keys.json") as f:
        wanted = set(json.load(f))
    got = set(load_file(weights))
    if got != wanted:
        raise AssertionError(f"{name}: the export's tensors differ from the graph's: only in the "
                             f"export {sorted(got - wanted)}, only in the graph "
                             f"{sorted(wanted - got)}")


def _graph(nodes, inputs, output, initializers, opset=17):
    """A model of `nodes` (onnx.helper), checked by onnx.checker."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.INT64 if n == "ids" else TensorProto.FLOAT,
                                       ["batch", *d]) for n, d in inputs],
        [helper.make_tensor_value_info(output[0], TensorProto.FLOAT, ["batch", *output[1]])],
        [numpy_helper.from_array(v if v.dtype == np.int64 else
                                 rng.standard_normal(v.shape).astype(np.float32) * 0.1, k)
         for k, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def op_graphs():
    """{case: (model, the layer kinds it maps to, or the refusal's words)}:
    each supported op, and each refusal, as the onnx package writes them."""
    import numpy as np
    from onnx import helper

    z = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731 (values drawn in _graph)
    ints = lambda *v: np.array(v, np.int64)  # noqa: E731
    n = helper.make_node
    img, fc = [("x", [3, 8, 8])], {"fc.weight": z(4, 3 * 8 * 8), "fc.bias": z(4)}
    head = [n("Flatten", ["h"], ["f"]), n("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], transB=1)]
    conv = {"c.weight": z(3, 3, 3, 3), "c.bias": z(3)}

    def image(nodes, extra=None, out=("y", [4])):
        return _graph(nodes + head, img, out, {**fc, **conv, **(extra or {})})

    bn = {f"bn.{k}": z(3) + (1 if k.endswith(("weight", "var")) else 0)
          for k in ("weight", "bias", "running_mean", "running_var")}
    gap_head = [n("Flatten", ["g"], ["f"]), n("Gemm", ["f", "fc2.weight"], ["y"], transB=1)]
    cases = {
        "Conv": (image([n("Conv", ["x", "c.weight", "c.bias"], ["h"], pads=[1, 1, 1, 1])]),
                 "conv2d flatten dense"),
        "Relu": (image([n("Relu", ["x"], ["h"])]), "relu flatten dense"),
        "MaxPool": (_graph([n("MaxPool", ["x"], ["h"], kernel_shape=[2, 2], strides=[2, 2]),
                            *head], img, ("y", [4]), {"fc.weight": z(4, 48), "fc.bias": z(4)}),
                    "max_pool flatten dense"),
        "AveragePool": (_graph([n("AveragePool", ["x"], ["h"], kernel_shape=[3, 3], pads=[1] * 4,
                                  strides=[2, 2]), *head], img, ("y", [4]),
                               {"fc.weight": z(4, 48), "fc.bias": z(4)}),
                        "avg_pool flatten dense"),
        "BatchNormalization": (image([n("BatchNormalization", ["x", *bn], ["h"])], bn),
                               "batch_norm flatten dense"),
        "Add": (image([n("Conv", ["x", "c.weight"], ["c"], pads=[1] * 4), n("Relu", ["c"], ["r"]),
                       n("Add", ["c", "r"], ["h"])]), "conv2d relu add flatten dense"),
        "Concat": (_graph([n("Relu", ["x"], ["r"]), n("Concat", ["r", "r"], ["h"], axis=1), *head],
                          img, ("y", [4]), {"fc.weight": z(4, 384), "fc.bias": z(4)}),
                   "relu concat flatten dense"),
        "refuse_input_twice": (image([n("Conv", ["x", "c.weight"], ["c"], pads=[1] * 4),
                                      n("Add", ["c", "x"], ["h"])]),
                               "reads the graph's input after another node has"),
        "GlobalAveragePool": (_graph([n("GlobalAveragePool", ["x"], ["g"]), *gap_head], img,
                                     ("y", [4]), {"fc2.weight": z(4, 3)}),
                              "global_avg_pool dense"),
        "ReduceMean": (_graph([n("ReduceMean", ["x", "axes"], ["g"]), *gap_head], img, ("y", [4]),
                              {"fc2.weight": z(4, 3), "axes": ints(2, 3)}, opset=18),
                       "global_avg_pool dense"),
        "Reshape": (_graph([n("Reshape", ["x", "shape"], ["f"]),
                            n("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], transB=1)], img,
                           ("y", [4]), {**fc, "shape": ints(0, -1)}), "flatten dense"),
        "MatMul": (_graph([n("MatMul", ["v", "w"], ["m"]), n("Add", ["m", "b"], ["y"])],
                          [("v", [6])], ("y", [4]), {"w": z(6, 4), "b": z(4)}), "dense"),
        "Dropout": (_graph([n("Dropout", ["v"], ["d"]), n("Gemm", ["d", "w"], ["y"])],
                           [("v", [6])], ("y", [4]), {"w": z(6, 4)}), "dropout dense"),
        "Identity": (_graph([n("Identity", ["v"], ["i"]), n("Gemm", ["i", "w"], ["y"])],
                            [("v", [6])], ("y", [4]), {"w": z(6, 4)}), "dense"),
        "Softmax": (_graph([n("Gemm", ["v", "w"], ["l"]), n("Softmax", ["l"], ["y"])],
                           [("v", [6])], ("y", [4]), {"w": z(6, 4)}), "dense"),
        "LogSoftmax": (_graph([n("Gemm", ["v", "w"], ["l"]), n("LogSoftmax", ["l"], ["y"])],
                              [("v", [6])], ("y", [4]), {"w": z(6, 4)}), "dense"),
        "Gather": (_graph([n("Gather", ["emb.weight", "ids"], ["r"]), n("Flatten", ["r"], ["f"]),
                           n("Gemm", ["f", "w"], ["y"])], [("ids", [3])], ("y", [4]),
                          {"emb.weight": z(20, 5), "w": z(15, 4)}), "embedding flatten dense"),
        # Refusals: the words the one sentence must hold.
        "refuse_op": (_graph([n("Tanh", ["v"], ["t"], name="/t/Tanh"), n("Gemm", ["t", "w"], ["y"])],
                             [("v", [6])], ("y", [4]), {"w": z(6, 4)}),
                      'node "/t/Tanh" (Tanh): op Tanh is not supported'),
        "refuse_group": (image([n("Conv", ["x", "g.weight"], ["h"], group=3, pads=[1] * 4)],
                               {"g.weight": z(3, 1, 3, 3)}), "group 3 is not supported"),
        "refuse_dilation": (image([n("Conv", ["x", "c.weight"], ["h"], dilations=[2, 2],
                                     pads=[2] * 4)]), "dilations [2, 2] are not supported"),
        "refuse_ceil": (image([n("MaxPool", ["x"], ["h"], kernel_shape=[2, 2], ceil_mode=1)]),
                        "ceil_mode 1 is not supported"),
        "refuse_count_pad": (image([n("AveragePool", ["x"], ["h"], kernel_shape=[3, 3],
                                      pads=[1] * 4, count_include_pad=1)]),
                             "count_include_pad 1 with padding is not supported"),
        "refuse_broadcast": (image([n("Conv", ["x", "c.weight"], ["c"], pads=[1] * 4,
                                      strides=[2, 2]), n("Add", ["x", "c"], ["h"])]),
                             "adds [3, 8, 8] and [3, 4, 4]; Downpour adds tensors of one shape"),
        "refuse_pool_reader": (image([n("GlobalAveragePool", ["x"], ["g"]),
                                      n("Relu", ["g"], ["h"])]),
                               'a global average pool\'s [3, 1, 1], which Downpour keeps as the '
                               'vector [3]'),
        "refuse_trans_a": (_graph([n("Gemm", ["v", "w"], ["y"], transA=1)], [("v", [6])],
                                  ("y", [4]), {"w": z(6, 4)}), "transA 1 are not supported"),
        "refuse_flat_image": (_graph([n("Flatten", ["x"], ["f"]), n("Relu", ["f"], ["r"]),
                                      n("Gemm", ["r", "fc.weight", "fc.bias"], ["y"], transB=1)],
                                     img, ("y", [4]), fc), 'reads the flattened image "f"'),
        "refuse_reshape": (_graph([n("Reshape", ["x", "shape"], ["f"]),
                                   n("Gemm", ["f", "fc.weight", "fc.bias"], ["y"], transB=1)],
                                  img, ("y", [4]), {**fc, "shape": ints(0, 3, -1)}),
                           "is not a flatten to [batch, 192]"),
        "refuse_opset": (_graph([n("Gemm", ["v", "w", "b"], ["y"])], [("v", [6])], ("y", [4]),
                                {"w": z(6, 4), "b": z(4)}, opset=7), "opset 7 is not supported"),
    }
    return cases


def check_import_ops(cluster, name, _, __):
    """Each op of the table in docs/job-specs.md, and each refusal, through
    `downpourctl model import`."""
    import onnx

    failures = []
    for case, (model, want) in op_graphs().items():
        path = os.path.join(cluster.work, f"{name}-{case}.onnx")
        onnx.save(model, path)
        result = subprocess.run([cluster.ctl_path, "model", "import", path], capture_output=True,
                                text=True, timeout=60)
        if case.startswith("refuse_"):
            if result.returncode != 2 or want not in result.stderr:
                failures.append(f"{case}: exit {result.returncode}, {result.stderr.strip()!r}")
            continue
        kinds = re.findall(r"(?m)^    (\w+) \{$", result.stdout)
        kinds = [k for k in kinds if k != "softmax_cross_entropy"]
        if result.returncode != 0 or " ".join(kinds) != want:
            failures.append(f"{case}: exit {result.returncode}, layers {kinds} (want {want}); "
                            f"{result.stderr.strip()!r}")
    print(f"{name}: {len(op_graphs())} graphs written by the onnx package imported or refused as "
          f"documented", flush=True)
    if failures:
        raise AssertionError(f"{name}: " + "; ".join(failures))


def check_import_refused(cluster, name, _, __):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["flat"], name="/flat/Flatten"),
         helper.make_node("Sigmoid", ["flat"], ["logits"], name="/act/Sigmoid")],
        "sigmoid", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 784])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 784])])
    path = os.path.join(cluster.work, name + ".onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    spec_path = os.path.join(cluster.work, name + ".pbtxt")
    with open(spec_path, "w") as f:
        f.write(TRAINING_PART % ("SGD", 0.1, 10))
    expected = f'{path}: node "/act/Sigmoid" (Sigmoid): op Sigmoid is not supported'
    for args in (["model", "import", path], ["submit", spec_path, "--model=" + path]):
        result = subprocess.run([cluster.ctl_path, "--coordinator=" + cluster.coordinator, *args],
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 2 or expected not in result.stderr:
            raise AssertionError(f"downpourctl {' '.join(args)} exited {result.returncode} with "
                                 f"{result.stderr!r}; expected 2 and {expected!r}")
    print(f"{name}: refused: {expected}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--junit", required=True)
    args = parser.parse_args()
    skip_reason = None
    try:
        import numpy  # noqa: F401
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        skip_reason = (f"NumPy, onnx or onnxruntime missing ({e}); scripts/python-deps.sh "
                       "installs them")
    work = tempfile.mkdtemp(prefix="downpour-onnx-")
    cluster = Cluster(args.bin, work)
    data = os.path.join(work, "data")
    with open(os.path.join(ROOT, "examples/fashion_mnist_mlp.pbtxt")) as f:
        mlp = re.sub(r"(?m)^steps: \d+$", f"steps: {STEPS}", f.read())
    specs = {"mlp": (mlp, check_onnx_export), "cnn_bn": (CNN_BN, check_onnx_export),
             "ctr": (CTR, check_onnx_export), "sparse": (SPARSE, check_refused),
             "import_identity": (None, check_import_identity),
             "import_train": (None, check_import_train),
             "import_refused": (None, check_import_refused),
             "import_ops": (None, check_import_ops)}

    def setup():
        subprocess.run([cluster.ctl_path, "dataset", "generate", "--kind=ctr",
                        "--out_dir=" + os.path.join(data, "ctr"), "--name=ctr",
                        "--examples=40000", "--test_examples=10000", "--shards=2",
                        "--vocabulary=100:1000"], check=True, capture_output=True)
        images = image_test_set(data)
        return {"mlp": images, "cnn_bn": images, "ctr": ctr_test_set(data),
                "import_identity": images, "import_train": images}

    def case(text, check):
        def run(name, test_sets):
            spec_path = os.path.join(work, name + ".pbtxt")
            if text is not None:
                with open(spec_path, "w") as f:
                    f.write(text)
            check(cluster, name, spec_path, test_sets.get(name))
        return run

    return run_cases("onnx_test", "OnnxTest", args.junit, cluster, skip_reason, setup,
                     [(name, case(text, check)) for name, (text, check) in specs.items()])


if __name__ == "__main__":
    sys.exit(main())
