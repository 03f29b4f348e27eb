#!/usr/bin/env python3
"""PyTorch models into Downpour as ONNX, and back, on the machine it runs on.

For each model of bench/onnx_models.py (the PyTorch definitions of
bench/pytorch_step_time.py: mlp, cnn, resnet18), on a local cluster (one
coordinator, two shards, two workers; --worker_flags=--devices=0 trains on
GPU 0):
  spec     the job of its example spec (examples/fashion_mnist_NAME.pbtxt) as
           written, the model in Downpour's text format;
  onnx     the same job with the model and its initial weights from NAME.onnx
           (torch.onnx.export of the PyTorch module):
           `downpourctl submit --model=NAME.onnx` with the spec's training
           part (the spec without its model);
  ort      the onnx job exported with `downpourctl export --format=onnx` and
           run by ONNX Runtime on the Fashion-MNIST test set;
  arch     the layers `downpourctl model import` makes of NAME.onnx with
           Downpour's own initial weights (the spec's training part and
           the imported model, no --init_from): tells the architecture's
           share of a difference from the weights';
  pytorch  the onnx job exported as safetensors (PyTorch's names and
           layouts), loaded into the PyTorch module with
           load_state_dict(strict=True) and evaluated by PyTorch.
The spec and onnx jobs run with the spec's seed set to 1..--seeds (data
order; the spec job's initial weights too, while the onnx job's come from
the file), since the two start from different weights (PyTorch's
initialisation against Downpour's He-uniform). The last seed's onnx job is
exported and run by ONNX Runtime and PyTorch. Prints one JSON line per model
with the test accuracies, their means and the jobs' wall times; "ok" when the
means are within 0.005 and ONNX Runtime and PyTorch within 0.002 of the job
(GPU and CPU arithmetic differ in the last bits). Needs torch, onnx,
onnxruntime, numpy.
usage: onnx_bridge.py --bin DIR --models DIR [--names mlp,cnn,resnet18]
                      [--seeds 3] [--worker_flags=--devices=0] [--work DIR]
  --bin     the programs: a bazel-bin tree or scripts/pack-binaries.sh's bin/
  --models  bench/onnx_models.py's --out (NAME.onnx, NAME.pt)
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)
from export_numpy_test import Cluster, load_test_set  # noqa: E402
from onnx_test import ort_accuracy  # noqa: E402


def without_model(text):
    """The spec's text without its `model { ... }` block."""
    start = re.search(r"(?m)^model \{", text)
    if start is None:
        raise ValueError("the spec has no model block")
    depth, at = 0, start.start()
    for at in range(start.end() - 1, len(text)):
        depth += {"{": 1, "}": -1}.get(text[at], 0)
        if depth == 0:
            break
    return text[:start.start()] + text[at + 1:]


def pytorch_accuracy(name, weights_path, images, labels):
    import torch

    from export_pytorch_check import read_safetensors
    from onnx_models import model_makers
    model = model_makers()[name]()
    model.load_state_dict(read_safetensors(weights_path), strict=True)
    model.eval()
    right = 0
    with torch.no_grad():
        for at in range(0, len(images), 1000):
            logits = model(torch.from_numpy(images[at:at + 1000]))
            right += int((logits.argmax(1).numpy() == labels[at:at + 1000]).sum())
    return right / len(images)


def run_job(cluster, spec_path, job_id, *extra):
    start = time.time()
    cluster.ctl("submit", spec_path, "--job_id=" + job_id, "--wait", *extra)
    job = json.loads(cluster.ctl("-o", "json", "get", job_id))
    return job["test_accuracy"], round(time.time() - start, 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--models", required=True)
    parser.add_argument("--names", default="mlp,cnn,resnet18")
    parser.add_argument("--worker_flags", default="")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--work", default="")
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="downpour-onnx-bridge-")
    os.makedirs(work, exist_ok=True)
    cluster = Cluster(args.bin, work, args.worker_flags.split())
    images, labels = load_test_set()
    failed = True
    try:
        cluster.start()
        for name in args.names.split(","):
            with open(os.path.join(ROOT, f"examples/fashion_mnist_{name}.pbtxt")) as f:
                spec_text = f.read()
            spec_path = os.path.join(work, name + ".pbtxt")
            train_path = os.path.join(work, name + "-train.pbtxt")
            onnx_file = os.path.join(args.models, name + ".onnx")
            result = {"model": name, "onnx": onnx_file, "spec": [], "onnx_job": [],
                      "arch_own_init": []}
            for seed in range(1, args.seeds + 1):
                seeded = [re.sub(r"(?m)^seed: \d+$", f"seed: {seed}", t)
                          for t in (spec_text, without_model(spec_text))]
                for path, text in zip((spec_path, train_path), seeded):
                    with open(path, "w") as f:
                        f.write(text)
                job = f"{name}-{seed}"
                accuracy, result["spec_s"] = run_job(cluster, spec_path, job + "-spec")
                result["spec"].append(accuracy)
                accuracy, result["onnx_s"] = run_job(cluster, train_path, job + "-onnx",
                                                     "--model=" + onnx_file)
                result["onnx_job"].append(accuracy)
                # The imported layers with Downpour's own initialisation:
                # what is the architecture's and what the weights'.
                imported = os.path.join(work, name + "-imported.pbtxt")
                cluster.ctl("model", "import", onnx_file, "--out=" + imported)
                with open(imported) as f:
                    model_text = f.read()
                arch_path = os.path.join(work, name + "-arch.pbtxt")
                with open(arch_path, "w") as f:
                    f.write(seeded[1] + model_text)
                accuracy, _ = run_job(cluster, arch_path, job + "-arch")
                result["arch_own_init"].append(accuracy)
            # The last seed's ONNX job, exported both ways and run elsewhere.
            exported = os.path.join(work, name + "-out.onnx")
            cluster.ctl("export", job + "-onnx", "--format=onnx", "--out=" + exported)
            result["ort"] = ort_accuracy(exported, images, labels)
            weights = os.path.join(work, name + "-out.safetensors")
            cluster.ctl("export", job + "-onnx", "--out=" + weights)
            result["pytorch"] = pytorch_accuracy(name, weights, images, labels)
            mean = lambda v: sum(v) / len(v)  # noqa: E731
            result["spec_mean"] = round(mean(result["spec"]), 4)
            result["onnx_mean"] = round(mean(result["onnx_job"]), 4)
            result["arch_mean"] = round(mean(result["arch_own_init"]), 4)
            result["ok"] = (abs(result["onnx_mean"] - result["spec_mean"]) <= 0.005 and
                            abs(result["ort"] - result["onnx_job"][-1]) <= 0.002 and
                            abs(result["pytorch"] - result["onnx_job"][-1]) <= 0.002)
            print(json.dumps(result), flush=True)
        failed = False
    finally:
        cluster.stop()
        if failed:
            print(f"onnx_bridge: logs in {work}", file=sys.stderr)
        elif not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
