"""Loads a `downpourctl export` file into a PyTorch module built from the job's
spec with load_state_dict(strict=True) and checks that the module's accuracy
on the Fashion-MNIST test set equals the job's (within 0.002).

The module is what a PyTorch user would write for the spec: nn.Conv2d,
nn.BatchNorm2d, nn.Linear, ... registered under the spec's layer names, NCHW
activations, torch.flatten before a dense layer. Needs only torch (the file is
read with a few lines of safetensors parsing here).
usage: export_pytorch_check.py --export MODEL.safetensors --job JOB.json
         [--fashion DIR] [--device cuda]
prints one JSON line: {"job", "tensors", "job_accuracy", "pytorch_accuracy", "ok"}
"""
import argparse
import gzip
import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    tensors = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        tensors[name] = torch.frombuffer(raw, dtype=DTYPES[t["dtype"]]).reshape(t["shape"]).clone()
    return tensors


def pair(values, default):
    values = [int(v) for v in values or []]
    if not values:
        return default
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def pads(cfg, in_hw, window, stride):
    """(top, bottom, left, right) as our spec resolves them (job.proto's Padding)."""
    mode = cfg.get("padding", "VALID")
    if mode == "SAME":
        out = []
        for size, k, s in zip(in_hw, window, stride):
            o = (size + s - 1) // s
            total = max((o - 1) * s + k - size, 0)
            out += [total // 2, total - total // 2]
        return tuple(out)
    if mode == "EXPLICIT":
        p = [int(v) for v in cfg.get("explicit_padding", [])]
        if len(p) == 2:
            return (p[0], p[0], p[1], p[1])
        return tuple(int(v) for v in p)
    return (0, 0, 0, 0)


class SpecNet(nn.Module):
    """The spec's graph with PyTorch modules named as its layers."""

    def __init__(self, model):
        super().__init__()
        shape = [int(d) for d in model["input_shape"]]  # JSON writes int64 as strings.
        shapes = {"": [shape[2], shape[0], shape[1]] if len(shape) == 3 else shape}
        self.graph = []
        prev = ""
        for i, layer in enumerate(model["layer"]):
            kind = next(k for k in layer if k not in ("name", "inputs"))
            cfg = layer[kind] or {}
            name = layer.get("name") or f"{kind}{i}"
            inputs = layer.get("inputs") or [prev]
            x = shapes[inputs[0]]
            out = x
            extra = None
            if kind == "conv2d":
                k = pair(cfg.get("kernel_size"), None)
                s = pair(cfg.get("stride"), (1, 1))
                p = pads(cfg, x[1:], k, s)
                setattr(self, name, nn.Conv2d(x[0], int(cfg["filters"]), k, s,
                                              bias=not cfg.get("no_bias", False)))
                h = (x[1] + p[0] + p[1] - k[0]) // s[0] + 1
                w = (x[2] + p[2] + p[3] - k[1]) // s[1] + 1
                out, extra = [int(cfg["filters"]), h, w], p
            elif kind in ("max_pool", "avg_pool"):
                k = pair(cfg.get("window"), None)
                s = pair(cfg.get("stride"), k)
                p = pads(cfg, x[1:], k, s)
                h = (x[1] + p[0] + p[1] - k[0]) // s[0] + 1
                w = (x[2] + p[2] + p[3] - k[1]) // s[1] + 1
                out, extra = [x[0], h, w], (k, s, p)
            elif kind == "batch_norm":
                eps = cfg.get("epsilon") or 1e-3
                bn = nn.BatchNorm2d(x[0], eps=eps) if len(x) == 3 else nn.BatchNorm1d(x[0], eps=eps)
                setattr(self, name, bn)
            elif kind == "dense":
                setattr(self, name, nn.Linear(math.prod(x), int(cfg["units"]),
                                              bias=not cfg.get("no_bias", False)))
                out = [int(cfg["units"])]
            elif kind == "flatten":
                out = [math.prod(x)]
            elif kind == "global_avg_pool":
                out = [x[0]]
            elif kind == "embedding":
                setattr(self, name, nn.Embedding(int(cfg["vocab_size"]), int(cfg["dim"])))
                out = x + [int(cfg["dim"])]
            elif kind not in ("relu", "dropout", "add", "softmax_cross_entropy"):
                raise ValueError(f"layer {name}: {kind} is not supported here")
            shapes[name] = out
            self.graph.append((name, kind, inputs, extra))
            prev = name

    def forward(self, x):
        values = {"": x}
        for name, kind, inputs, extra in self.graph:
            h = values[inputs[0]]
            if kind == "conv2d":
                top, bottom, left, right = extra
                h = getattr(self, name)(F.pad(h, (left, right, top, bottom)))
            elif kind == "max_pool":
                k, s, (top, bottom, left, right) = extra
                h = F.max_pool2d(F.pad(h, (left, right, top, bottom), value=-math.inf), k, s)
            elif kind == "avg_pool":
                k, s, (top, bottom, left, right) = extra
                padded = F.pad(h, (left, right, top, bottom))
                count = F.pad(torch.ones_like(h[:, :1]), (left, right, top, bottom))
                h = F.avg_pool2d(padded, k, s) / F.avg_pool2d(count, k, s)
            elif kind in ("batch_norm", "dense", "embedding"):
                h = getattr(self, name)(h.flatten(1) if kind == "dense" else h)
            elif kind == "flatten":
                h = torch.flatten(h, 1)
            elif kind == "global_avg_pool":
                h = h.mean(dim=(2, 3))
            elif kind == "relu":
                h = F.relu(h)
            elif kind == "add":
                h = sum(values[i] for i in inputs)
            values[name] = h
        return h


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--export", required=True)
    parser.add_argument("--job", required=True, help="`downpourctl -o json get JOB` output")
    parser.add_argument("--fashion", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    job = json.load(open(args.job))
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    net = SpecNet(job["spec"]["model"])
    state = read_safetensors(args.export)
    net.load_state_dict(state, strict=True)  # Every name and shape must match.
    net = net.to(args.device).eval()
    with gzip.open(os.path.join(args.fashion, "t10k-images-idx3-ubyte.gz")) as f:
        images = torch.frombuffer(bytearray(f.read()[16:]), dtype=torch.uint8)
    with gzip.open(os.path.join(args.fashion, "t10k-labels-idx1-ubyte.gz")) as f:
        labels = torch.frombuffer(bytearray(f.read()[8:]), dtype=torch.uint8).long()
    # Scaled as the job scaled them (data/example.cc): float32(pixel) * (1.0f / 255.0f), the
    # same float32 values, NCHW (one channel).
    scale = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(255.0, dtype=torch.float32)
    images = (images.reshape(-1, 1, 28, 28).float() * scale).to(args.device)
    labels = labels.to(args.device)
    correct = 0
    with torch.no_grad():
        for at in range(0, len(images), 1000):
            logits = net(images[at:at + 1000])
            correct += int((logits.argmax(1) == labels[at:at + 1000]).sum())
    ours = correct / len(images)
    theirs = job.get("test_accuracy", -1)
    ok = abs(ours - theirs) <= 0.002
    print(json.dumps({"job": job["id"], "tensors": len(state), "job_accuracy": theirs,
                      "pytorch_accuracy": ours, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
