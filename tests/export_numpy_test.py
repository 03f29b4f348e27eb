"""A trained model leaves Downpour in a form NumPy (and so PyTorch) can use.

Starts the real daemons on loopback with a checkpoint root (one coordinator,
two shards, two workers), trains examples/fashion_mnist_mlp.pbtxt and
examples/fashion_mnist_cnn_bn.pbtxt (a CNN with batch norm), each for a few
hundred steps (the export of what was trained is checked, not how far it
got), exports each
with `downpourctl export` in PyTorch's layout, loads the file with the PyPI
safetensors package and runs the network's forward pass in NumPy, written the
way PyTorch computes it (NCHW, Linear as x @ W.T + b, batch norm from its
running statistics), on the Fashion-MNIST test set. Its accuracy must equal
the one the job reported within 0.002.

Run by scripts/test.sh with the venv of scripts/python-deps.sh, after the
build; writes JUnit XML for scripts/count_tests.py.
usage: export_numpy_test.py --bin BAZEL_BIN --junit OUT.xml
"""
import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
TOLERANCE = 0.002


def load_test_set():
    import numpy as np

    with gzip.open(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return images.astype(np.float32) / np.float32(255), labels


# ------------------------------------------------- PyTorch's ops, in NumPy


def linear(x, t, name):
    return x.reshape(len(x), -1) @ t[name + ".weight"].T + t[name + ".bias"]


def conv3x3_same(x, weight):
    import numpy as np

    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    return np.einsum("nchwij,ocij->nohw", windows, weight, optimize=True)


def batch_norm(x, t, name, eps=1e-3):
    import numpy as np

    shape = (1, -1, 1, 1)
    scale = t[name + ".weight"] / np.sqrt(t[name + ".running_var"] + eps)
    return (x - t[name + ".running_mean"].reshape(shape)) * scale.reshape(shape) + t[
        name + ".bias"
    ].reshape(shape)


def max_pool2(x):
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def relu(x):
    return x.clip(min=0)


def mlp(x, t):
    h = relu(linear(x, t, "fc1"))
    h = relu(linear(h, t, "fc2"))
    return linear(h, t, "logits")


def cnn_bn(x, t):
    h = max_pool2(relu(batch_norm(conv3x3_same(x, t["conv1.weight"]), t, "bn1")))
    h = max_pool2(relu(batch_norm(conv3x3_same(h, t["conv2.weight"]), t, "bn2")))
    return linear(h, t, "logits")  # Flattened NCHW, as torch.flatten does.


def accuracy(forward, tensors, images, labels):
    correct = 0
    for at in range(0, len(images), 1000):
        logits = forward(images[at : at + 1000], tensors)
        correct += int((logits.argmax(axis=1) == labels[at : at + 1000]).sum())
    return correct / len(images)


# ------------------------------------------------------------ the cluster


class Cluster:
    """One coordinator (with a checkpoint root), two shards and two workers on
    loopback, from BIN: a bazel-bin tree, or a flat folder of the programs
    (scripts/pack-binaries.sh's bin/). `worker_flags` go to every worker
    (bench/onnx_bridge.py: --devices=0)."""

    def __init__(self, bin_dir, work, worker_flags=()):
        self.bin = bin_dir
        self.work = work
        self.worker_flags = list(worker_flags)
        self.procs = []
        self.root = os.path.join(work, "checkpoints")

    def program(self, path):
        flat = os.path.join(self.bin, os.path.basename(path))
        return flat if os.path.exists(flat) else os.path.join(self.bin, path)

    def daemon(self, name, binary, *flags):
        log = open(os.path.join(self.work, name + ".log"), "w")
        port_file = os.path.join(self.work, name + ".port")
        if os.path.exists(port_file):  # A reused work folder's, of a daemon gone.
            os.remove(port_file)
        self.procs.append(
            subprocess.Popen(
                [self.program(binary), "--listen=127.0.0.1:0",
                 "--port_file=" + port_file, *flags],
                stdout=log, stderr=subprocess.STDOUT))
        deadline = time.time() + 30
        while not (os.path.exists(port_file) and os.path.getsize(port_file) > 0):
            if time.time() > deadline or self.procs[-1].poll() is not None:
                raise RuntimeError(f"{name} did not start; see {log.name}")
            time.sleep(0.05)
        with open(port_file) as f:
            return f.read().strip()

    def start(self):
        self.ctl_path = self.program("client/downpourctl")
        data = os.path.join(self.work, "data")
        subprocess.run([self.ctl_path, "dataset", "import", "--fashion_mnist=" + FASHION,
                        "--out_dir=" + os.path.join(data, "fashion-mnist"), "--shards=4"],
                       check=True, capture_output=True)
        self.coordinator = self.daemon(
            "coordinator", "coordinator/downpour-coordinator",
            "--state_dir=" + os.path.join(self.work, "state"), "--checkpoint_root=" + self.root)
        for i in range(2):
            self.daemon(f"ps{i}", "server/downpour-ps", "--coordinator=" + self.coordinator,
                        "--checkpoint_root=" + self.root)
        for i in range(2):
            self.daemon(f"worker{i}", "worker/downpour-worker",
                        "--coordinator=" + self.coordinator, "--data_dir=" + data,
                        *self.worker_flags)

    def ctl(self, *args):
        result = subprocess.run([self.ctl_path, "--coordinator=" + self.coordinator, *args],
                                capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            raise RuntimeError(f"downpourctl {' '.join(args)} exited {result.returncode}: "
                               f"{result.stderr.strip()}")
        return result.stdout

    def finish(self, failed):
        """Stops the daemons, prints each one's last log lines after a
        failure, and removes the work folder."""
        self.stop()
        if failed:
            for log in sorted(os.listdir(self.work)):
                if log.endswith(".log"):
                    with open(os.path.join(self.work, log)) as f:
                        tail = f.readlines()[-15:]
                    print(f"--- {log}\n{''.join(tail)}", file=sys.stderr)
        shutil.rmtree(self.work, ignore_errors=True)

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def run_cases(suite_name, classname, junit, cluster, skip_reason, setup, cases):
    """The cases of a test that starts `cluster`: unless `skip_reason`, the
    cluster starts and setup() makes what the cases share; then each (name,
    check) runs as check(name, shared), one case's failure reported and the
    next run. A failure to start is a case "cluster". Writes JUnit XML to
    `junit`; returns the exit status (1 on any failure)."""
    suite = ET.Element("testsuite", name=suite_name)
    failed = False
    try:
        shared = None
        if skip_reason is None:
            cluster.start()
            shared = setup()
        for name, check in cases:
            case = ET.SubElement(suite, "testcase", classname=classname, name=name)
            if skip_reason is not None:
                ET.SubElement(case, "skipped", message=skip_reason)
                print(f"{name}: skipped: {skip_reason}")
                continue
            try:
                check(name, shared)
            except Exception as e:  # One case's failure is reported; the next runs.
                failed = True
                ET.SubElement(case, "failure", message=str(e)).text = traceback.format_exc()
                print(f"{name}: FAILED: {e}", file=sys.stderr)
    except Exception as e:
        failed = True
        case = ET.SubElement(suite, "testcase", classname=classname, name="cluster")
        ET.SubElement(case, "failure", message=str(e)).text = traceback.format_exc()
        print(f"{suite_name}: {e}", file=sys.stderr)
    finally:
        cluster.finish(failed)
    ET.ElementTree(suite).write(junit)
    return 1 if failed else 0


def check_export(cluster, spec, job_id, forward, test_set, steps):
    from safetensors.numpy import load_file

    # The example as it is but for its steps: what is checked is the export
    # of whatever was trained, not how far training gets.
    text = open(os.path.join(ROOT, spec)).read()
    shortened, n = re.subn(r"^steps: \d+$", f"steps: {steps}", text, flags=re.MULTILINE)
    if n != 1:
        raise AssertionError(f"{spec} has {n} top-level 'steps:' lines, expected 1")
    path = os.path.join(cluster.work, job_id + ".pbtxt")
    with open(path, "w") as f:
        f.write(shortened)
    cluster.ctl("submit", path, "--job_id=" + job_id, "--wait")
    job = json.loads(cluster.ctl("-o", "json", "get", job_id))
    out = os.path.join(cluster.work, job_id + ".safetensors")
    cluster.ctl("export", job_id, "--out=" + out)
    ours = accuracy(forward, load_file(out), *test_set)
    theirs = job["test_accuracy"]
    print(f"{job_id}: job test accuracy {theirs:.4f}, NumPy on the export {ours:.4f}")
    if abs(ours - theirs) > TOLERANCE:
        raise AssertionError(f"{job_id}: NumPy's accuracy {ours:.4f} on the exported model is "
                             f"not within {TOLERANCE} of the job's {theirs:.4f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--junit", required=True)
    args = parser.parse_args()
    skip_reason = None
    try:
        import numpy  # noqa: F401
        import safetensors  # noqa: F401
    except ImportError as e:
        skip_reason = f"NumPy or safetensors missing ({e}); scripts/python-deps.sh installs them"
    cluster = Cluster(args.bin, tempfile.mkdtemp(prefix="downpour-export-"))
    cases = [(name, lambda n, test_set, spec=spec, forward=forward, steps=steps:
              check_export(cluster, spec, n, forward, test_set, steps))
             for name, spec, forward, steps in [
                 ("mlp", "examples/fashion_mnist_mlp.pbtxt", mlp, 400),
                 ("cnn_bn", "examples/fashion_mnist_cnn_bn.pbtxt", cnn_bn, 300)]]
    return run_cases("export_numpy_test", "ExportNumpyTest", args.junit, cluster, skip_reason,
                     load_test_set, cases)


if __name__ == "__main__":
    sys.exit(main())
