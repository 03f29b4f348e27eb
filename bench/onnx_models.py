#!/usr/bin/env python3
"""Writes the PyTorch models of bench/pytorch_step_time.py as ONNX files, as a
PyTorch user hands a model to Downpour (`downpourctl submit --model=F.onnx`):
  mlp       Flatten, Linear(784, 256), ReLU, Linear(256, 128), ReLU, Linear(128, 10)
  cnn       two conv(3x3, pad 1)-ReLU-maxpool(2) blocks, Linear(3136, 128), Linear(128, 10)
  resnet18  pytorch_step_time's ResNet-18 with a one-channel stem (Fashion-MNIST
            is 28x28x1), batch norm, residual adds, global average pool
Each model is seeded (torch.manual_seed(SEED)), in eval mode, exported with
an input [batch, 1, 28, 28] named "input" (batch dynamic) and an output
"logits". --exporter torchscript (torch.onnx.export(dynamo=False), the weights
inside the file) or dynamo (torch.onnx.export(dynamo=True): the weights in
FILE.onnx.data beside it, which downpourctl reads too). Also writes
NAME.pt (the state_dict) and prints one JSON line per model.
usage: onnx_models.py --out DIR [--models mlp,cnn,resnet18] [--exporter torchscript|dynamo]
                      [--opset 17] [--seed 0]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="mlp,cnn,resnet18")
    parser.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo"])
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        import torch
        import torch.nn as nn
    except ImportError as e:
        sys.exit(f"onnx_models.py: PyTorch is missing ({e})")
    from pytorch_step_time import cnn, mlp, resnet18

    def resnet18_gray():
        model = resnet18()
        model[0] = nn.Conv2d(1, 64, 3, 1, 1, bias=False)
        return model

    makers = {"mlp": mlp, "cnn": cnn, "resnet18": resnet18_gray}
    os.makedirs(args.out, exist_ok=True)
    for name in args.models.split(","):
        if name not in makers:
            sys.exit(f"onnx_models.py: --models: unknown model {name!r} ({', '.join(makers)})")
        torch.manual_seed(args.seed)
        model = makers[name]().eval()
        path = os.path.join(args.out, name + ".onnx")
        example = torch.zeros(2, 1, 28, 28)
        if args.exporter == "dynamo":
            torch.onnx.export(model, (example,), path, dynamo=True, opset_version=args.opset,
                              input_names=["input"], output_names=["logits"],
                              dynamic_shapes=({0: torch.export.Dim("batch")},))
        else:
            torch.onnx.export(model, example, path, dynamo=False, opset_version=args.opset,
                              input_names=["input"], output_names=["logits"],
                              dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
        torch.save(model.state_dict(), os.path.join(args.out, name + ".pt"))
        print(json.dumps({"model": name, "onnx": path, "bytes": os.path.getsize(path),
                          "exporter": args.exporter, "opset": args.opset,
                          "parameters": sum(p.numel() for p in model.parameters()),
                          "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
