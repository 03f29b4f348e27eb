#!/usr/bin/env python3
"""Writes the PyTorch models of bench/pytorch_step_time.py as ONNX files, as a
PyTorch user hands a model to Downpour (`downpourctl submit --model=F.onnx`):
  mlp       Flatten, Linear(784, 256), ReLU, Linear(256, 128), ReLU, Linear(128, 10)
  cnn       two conv(3x3, pad 1)-ReLU-maxpool(2) blocks, Linear(3136, 128), Linear(128, 10)
  resnet18  pytorch_step_time's ResNet-18 with a one-channel stem (Fashion-MNIST
            is 28x28x1), batch norm, residual adds, global average pool
  small_resnet  conv-batch norm-ReLU-max pool, one residual block, global
            average pool, Linear(16, 10): tests/data/onnx's fixture
Each model is seeded (torch.manual_seed(SEED)), in eval mode, exported with
an input [batch, 1, 28, 28] named "input" (batch dynamic) and an output
"logits". --exporter torchscript (torch.onnx.export(dynamo=False), the weights
inside the file) or dynamo (torch.onnx.export(dynamo=True): the weights in
FILE.onnx.data beside it, which downpourctl reads too). --train_steps N first
trains the module N Adam steps on Fashion-MNIST (--fashion: its IDX files), so
the file predicts (tests/data/onnx: 300). Also writes NAME.pt (the
state_dict) and NAME.keys.json (its keys, what load_state_dict(strict=True)
wants of an export), and prints one JSON line per model.
usage: onnx_models.py --out DIR [--models mlp,cnn,resnet18] [--exporter torchscript|dynamo]
                      [--opset 17] [--seed 0] [--train_steps N --fashion DIR]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def strip_doc_strings(path):
    """Drops the exporter's doc strings and metadata (source locations on the
    machine that wrote the file); the graph and weights stay as written."""
    try:
        import onnx
    except ImportError:
        return
    model = onnx.load(path, load_external_data=False)
    for item in [model, model.graph, *model.graph.node, *model.graph.value_info,
                 *model.graph.input, *model.graph.output]:
        item.doc_string = ""
        if hasattr(item, "metadata_props"):
            del item.metadata_props[:]
    onnx.save(model, path)


def train(model, steps, fashion):
    """`steps` Adam steps (lr 1e-3, batch 128) on Fashion-MNIST's training set
    (IDX files in `fashion`), so the file holds a model that predicts."""
    import gzip

    import numpy as np
    import torch

    with gzip.open(os.path.join(fashion, "train-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(fashion, "train-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    x = torch.from_numpy(images.astype(np.float32) / np.float32(255))
    y = torch.from_numpy(labels.astype(np.int64))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        batch = torch.randint(0, len(x), (128,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def model_makers():
    """{name: a function making the PyTorch module}."""
    import torch.nn as nn
    from pytorch_step_time import BasicBlock, cnn, mlp, resnet18

    def resnet18_gray():
        model = resnet18()
        model[0] = nn.Conv2d(1, 64, 3, 1, 1, bias=False)
        return model

    def small_resnet():  # A few thousand weights: tests/data/onnx's fixture.
        return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                             nn.ReLU(), nn.MaxPool2d(2), BasicBlock(8, 16, 2),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    return {"mlp": mlp, "cnn": cnn, "resnet18": resnet18_gray, "small_resnet": small_resnet}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="mlp,cnn,resnet18")
    parser.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo"])
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train_steps", type=int, default=0)
    parser.add_argument("--fashion", default=os.environ.get(
        "FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
    args = parser.parse_args()
    try:
        import torch
    except ImportError as e:
        sys.exit(f"onnx_models.py: PyTorch is missing ({e})")
    makers = model_makers()
    os.makedirs(args.out, exist_ok=True)
    for name in args.models.split(","):
        if name not in makers:
            sys.exit(f"onnx_models.py: --models: unknown model {name!r} ({', '.join(makers)})")
        torch.manual_seed(args.seed)
        model = makers[name]()
        if args.train_steps > 0:
            train(model, args.train_steps, args.fashion)
        model.eval()
        path = os.path.join(args.out, name + ".onnx")
        example = torch.zeros(2, 1, 28, 28)
        if args.exporter == "dynamo":
            # Its optimizer folds batch norm into the convolutions of a
            # module in eval mode (as EVAL does below): for models without.
            torch.onnx.export(model, (example,), path, dynamo=True, opset_version=args.opset,
                              input_names=["input"], output_names=["logits"],
                              dynamic_shapes=({0: torch.export.Dim("batch")},))
        else:
            # PRESERVE: batch norm stays a node (EVAL, the default for a
            # module in eval mode, folds it into the convolution before it,
            # and the job would train without it).
            torch.onnx.export(model, example, path, dynamo=False, opset_version=args.opset,
                              training=torch.onnx.TrainingMode.PRESERVE,
                              input_names=["input"], output_names=["logits"],
                              dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
        strip_doc_strings(path)
        torch.save(model.state_dict(), os.path.join(args.out, name + ".pt"))
        with open(os.path.join(args.out, name + ".keys.json"), "w") as f:
            json.dump(list(model.state_dict()), f, indent=0)
        print(json.dumps({"model": name, "onnx": path, "bytes": os.path.getsize(path),
                          "exporter": args.exporter, "opset": args.opset,
                          "parameters": sum(p.numel() for p in model.parameters()),
                          "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
