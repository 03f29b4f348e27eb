#!/usr/bin/env python3
"""Downpour built and run with the CUDA toolkit hidden, as on a CPU-only host.

The daemons and downpourctl are built in a second Bazel output base under a
temporary folder (the main build's cache is left alone) with every
/usr/local/cuda* folder covered by an empty tmpfs in a private mount namespace
(root), or, where that cannot be had, CUDA_HOME pointing at an empty folder.
Nothing forces the CPU build: the @cuda repository has to find no toolkit on
its own (third_party/system/system.bzl). Then, with the toolkit still hidden:
  - @cuda//:defs.bzl says HAS_CUDA = False;
  - //kernels:factory_test passes (it checks what a build without CUDA says);
  - no binary links libcuda, libcudart, libcublas, libcudnn or libnccl (ldd);
  - the worker refuses --devices=0 with one sentence naming the missing CUDA;
  - a coordinator, one shard and one worker train a few hundred steps of
    examples/fashion_mnist_mlp.pbtxt on the CPU, and the job succeeds.

Runs outside `bazel test` (it runs Bazel itself): scripts/test.sh runs it and
counts its cases with the suite. A cold build of the daemons takes about 14
minutes on two cores; with --disk_cache=DIR naming the main build's disk cache
(scripts/test.sh does) only what CUDA changes is built again (the kernels and
the links). --output_base=DIR keeps the build there for the next run.
usage: tests/cpu_only_build_test.py --junit FILE [--output_base DIR] [--disk_cache DIR]
                                    [--steps N]
"""
import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from junit import write_junit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAEMONS = {
    "coordinator": "//coordinator:downpour-coordinator",
    "ps": "//server:downpour-ps",
    "worker": "//worker:downpour-worker",
    "ctl": "//client:downpourctl",
}
CUDA_LIBRARIES = re.compile(r"lib(cuda|cudart|cublas|cublasLt|cudnn\w*|nccl)\.so")
FASHION = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")

# Runs its arguments with every /usr/local/cuda* folder covered by an empty,
# read-only tmpfs (mounting over the /usr/local/cuda link covers its target).
HIDE_CUDA = ('for d in /usr/local/cuda /usr/local/cuda-*; do '
             '[ -d "$d" ] && { mount -t tmpfs -o ro,size=1m downpour-no-cuda "$d" || exit 97; }; '
             'done; exec "$@"')


class Failure(Exception):
    pass


class HiddenCuda:
    """How commands run with the toolkit out of sight, and the environment."""

    def __init__(self, scratch):
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("CUDA_HOME", "CUDA_PATH", "DOWNPOUR_CUDA")}
        self.prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", HIDE_CUDA,
                       "hide-cuda"]
        probe = subprocess.run(self.prefix + ["test", "!", "-e", "/usr/local/cuda/bin/nvcc"],
                               env=self.env, capture_output=True)
        if os.geteuid() == 0 and shutil.which("unshare") and probe.returncode == 0:
            self.how = ("every /usr/local/cuda* covered by an empty tmpfs (private mount namespace)"
                        if glob.glob("/usr/local/cuda*") else "no /usr/local/cuda* on this machine")
            # PATH stays the caller's (its CUDA folders are empty here): the
            # actions CUDA does not change are then the main build's, and
            # come from a shared --disk_cache.
        else:
            self.prefix = []
            self.env["PATH"] = ":".join(p for p in os.environ.get("PATH", "").split(":")
                                        if "cuda" not in p.lower())
            empty = os.path.join(scratch, "no-cuda")
            os.makedirs(empty)
            self.env["CUDA_HOME"] = empty
            self.how = ("CUDA_HOME set to an empty folder (no private mount namespace here: "
                        "needs root and unshare)")

    def command(self, args):
        return self.prefix + args


def run(hidden, args, log, timeout):
    with open(log, "ab") as out:
        result = subprocess.run(hidden.command(args), cwd=ROOT, env=hidden.env, stdout=out,
                                stderr=subprocess.STDOUT, timeout=timeout)
    return result.returncode


def tail(path, lines=25):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def wait_for_file(path, seconds, processes):
    deadline = time.monotonic() + seconds
    while not (os.path.exists(path) and os.path.getsize(path) > 0):
        for name, p in processes.items():
            if p.poll() is not None:
                raise Failure(f"{name} exited with {p.returncode} before serving")
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {seconds} s waiting for {path}")
        time.sleep(0.1)
    with open(path) as f:
        return f.read().strip()


class Run:
    def __init__(self, args):
        self.args = args
        self.scratch = tempfile.mkdtemp(prefix="downpour-cpu-only.")
        self.output_base = args.output_base or os.path.join(self.scratch, "output_base")
        self.hidden = HiddenCuda(self.scratch)
        self.log = os.path.join(self.scratch, "bazel.log")
        self.bin = None
        self.processes = {}

    def bazel_command(self, *args):
        # A server left behind by a crash goes away on its own.
        command = ["bazel", f"--output_base={self.output_base}", "--max_idle_secs=120", *args]
        if self.args.disk_cache and args[0] in ("build", "test"):
            command.insert(4, f"--disk_cache={self.args.disk_cache}")
        return command

    def bazel(self, *args, timeout=1800):
        return run(self.hidden, self.bazel_command(*args), self.log, timeout)

    # ---- cases: each returns None or raises Failure

    def build(self):
        start = time.monotonic()
        # --symlink_prefix=/: no bazel-* links, so the workspace's keep
        # pointing at the main build.
        if self.bazel("build", "--symlink_prefix=/", "--noshow_progress", *DAEMONS.values()):
            raise Failure("bazel build failed:\n" + tail(self.log))
        print(f"cpu-only: daemons and downpourctl built in {time.monotonic() - start:.0f} s "
              f"({self.hidden.how})")
        out = subprocess.run(
            self.hidden.command(self.bazel_command("info", "bazel-bin")),
            cwd=ROOT, env=self.hidden.env, capture_output=True, text=True)
        self.bin = out.stdout.strip()
        if out.returncode or not os.path.isdir(self.bin):
            raise Failure("bazel info bazel-bin failed: " + out.stderr[-500:])

    def detects_no_toolkit(self):
        path = os.path.join(self.output_base, "external", "cuda", "defs.bzl")
        with open(path) as f:
            defs = f.read()
        if "HAS_CUDA = False" not in defs:
            raise Failure(f"{path} does not say HAS_CUDA = False:\n{defs}")
        if "no CUDA toolkit" not in defs:
            raise Failure(f"{path} gives another reason than a missing toolkit:\n{defs}")

    def factory_test(self):
        if self.bazel("test", "--symlink_prefix=/", "--noshow_progress", "//kernels:factory_test"):
            raise Failure("//kernels:factory_test failed:\n" + tail(self.log, 40))

    def links_no_cuda(self):
        bad = []
        for name, label in DAEMONS.items():
            path = self.binary(name)
            out = subprocess.run(["ldd", path], capture_output=True, text=True)
            if out.returncode:
                raise Failure(f"ldd {path} failed: {out.stderr.strip()}")
            bad += [f"{label}: {line.strip()}" for line in out.stdout.splitlines()
                    if CUDA_LIBRARIES.search(line)]
        if bad:
            raise Failure("linked against CUDA libraries:\n" + "\n".join(bad))

    def refuses_gpu(self):
        data = os.path.join(self.scratch, "empty")
        os.makedirs(data, exist_ok=True)
        out = subprocess.run(self.hidden.command([
            self.binary("worker"), "--devices=0", "--listen=127.0.0.1:0",
            "--coordinator=127.0.0.1:1", f"--data_dir={data}"]),
            env=self.hidden.env, capture_output=True, text=True, timeout=60)
        if out.returncode == 0 or "built without CUDA" not in out.stderr:
            raise Failure(f"--devices=0 gave exit {out.returncode}, stderr: {out.stderr[-800:]}")
        print("cpu-only: " + out.stderr.strip().splitlines()[-1])

    def trains_on_cpu(self):
        data = os.path.join(self.scratch, "data")
        if not glob.glob(os.path.join(FASHION, "*.gz")):
            raise Failure(f"no Fashion-MNIST under {FASHION} (scripts/install-deps.sh installs "
                          "dataset-fashion-mnist)")
        imported = subprocess.run(self.hidden.command([
            self.binary("ctl"), "dataset", "import", f"--fashion_mnist={FASHION}",
            f"--out_dir={data}/fashion-mnist", "--shards=2"]),
            env=self.hidden.env, capture_output=True, text=True, timeout=300)
        if imported.returncode:
            raise Failure("dataset import failed: " + imported.stderr[-800:])
        with open(os.path.join(ROOT, "examples", "fashion_mnist_mlp.pbtxt")) as f:
            spec = f.read()
        for field, value in (("num_workers", 1), ("num_shards", 1), ("steps", self.args.steps)):
            spec, n = re.subn(rf"^{field}: \d+$", f"{field}: {value}", spec, flags=re.M)
            if n != 1:
                raise Failure(f"examples/fashion_mnist_mlp.pbtxt has no line '{field}: N'")
        spec_path = os.path.join(self.scratch, "job.pbtxt")
        with open(spec_path, "w") as f:
            f.write(spec)

        work = self.scratch
        self.start("coordinator", "--listen=127.0.0.1:0", f"--port_file={work}/coordinator.port",
                   f"--state_dir={work}/state", f"--checkpoint_root={work}/checkpoints")
        coordinator = wait_for_file(f"{work}/coordinator.port", 60, self.processes)
        self.start("ps", "--listen=127.0.0.1:0", f"--port_file={work}/ps.port",
                   f"--coordinator={coordinator}", f"--checkpoint_root={work}/checkpoints")
        self.start("worker", "--listen=127.0.0.1:0", f"--port_file={work}/worker.port",
                   f"--coordinator={coordinator}", f"--data_dir={data}", "--devices=auto")
        wait_for_file(f"{work}/ps.port", 60, self.processes)
        wait_for_file(f"{work}/worker.port", 60, self.processes)
        submitted = subprocess.run(self.hidden.command([
            self.binary("ctl"), f"--coordinator={coordinator}", "submit", spec_path, "--wait",
            "--timeout=600s"]), env=self.hidden.env, capture_output=True, text=True, timeout=660)
        result = submitted.stdout.strip()
        print(f"cpu-only: {result}")
        m = re.search(r"SUCCEEDED steps=(\d+) test_accuracy=([\d.]+)", result)
        if submitted.returncode or not m:
            raise Failure(f"the job did not succeed (exit {submitted.returncode}): {result}\n"
                          f"{submitted.stderr[-800:]}\n" + self.daemon_logs())
        if int(m.group(1)) != self.args.steps:
            raise Failure(f"the job ran {m.group(1)} steps, not {self.args.steps}")
        # Ten classes: chance is 0.1; a few hundred steps of this MLP reach
        # about 0.8, so 0.5 says it learned without pinning CPU rounding.
        if float(m.group(2)) < 0.5:
            raise Failure(f"test accuracy {m.group(2)} after {m.group(1)} steps: it did not learn")
        worker_log = tail(f"{work}/worker.log", 1000)
        if not re.search(r"built without CUDA.*computing on the CPU", worker_log):
            raise Failure("the worker's log does not say it computes on the CPU, built without "
                          "CUDA:\n" + worker_log[-1500:])

    # ---- helpers

    def binary(self, name):
        label = DAEMONS[name]
        return os.path.join(self.bin, label[2:].replace(":", "/"))

    def start(self, name, *flags):
        log = open(os.path.join(self.scratch, f"{name}.log"), "wb")
        self.processes[name] = subprocess.Popen(
            self.hidden.command([self.binary(name), *flags]), env=self.hidden.env, stdout=log,
            stderr=subprocess.STDOUT)

    def daemon_logs(self):
        return "".join(f"--- {name}.log\n" + tail(os.path.join(self.scratch, f"{name}.log"), 15)
                       for name in self.processes)

    def close(self):
        for p in self.processes.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.processes.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        subprocess.run(self.hidden.command(self.bazel_command("shutdown")), cwd=ROOT,
                       env=self.hidden.env, capture_output=True)
        if not self.args.output_base:
            subprocess.run(["chmod", "-R", "u+w", self.scratch], capture_output=True)
        shutil.rmtree(self.scratch, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--junit", help="write the results as JUnit XML here")
    parser.add_argument("--output_base", help="keep the CPU-only Bazel output base here")
    parser.add_argument("--disk_cache",
                        help="Bazel's --disk_cache, shared with the main build: the actions "
                             "that CUDA does not change are taken from it")
    parser.add_argument("--steps", type=int, default=300, help="training steps of the job")
    args = parser.parse_args()
    test = Run(args)
    cases = [
        ("the daemons and downpourctl build with the CUDA toolkit hidden", test.build),
        ("@cuda finds no toolkit by itself (HAS_CUDA = False)", test.detects_no_toolkit),
        ("//kernels:factory_test passes built without CUDA", test.factory_test),
        ("no binary links a CUDA library (ldd)", test.links_no_cuda),
        ("the worker refuses --devices=0, naming the build without CUDA", test.refuses_gpu),
        ("a job trains on the CPU through the CPU-only daemons", test.trains_on_cpu),
    ]
    results = []  # (name, failure message or None)
    try:
        for i, (name, case) in enumerate(cases):
            try:
                case()
                results.append((name, None))
            except (Failure, OSError, subprocess.SubprocessError) as e:
                results.append((name, str(e) or type(e).__name__))
                if i == 0:  # nothing else can run without the build
                    results += [(n, "not run: the build failed") for n, _ in cases[1:]]
                    break
    finally:
        test.close()
    failed = [(name, message) for name, message in results if message]
    for name, message in failed:
        print(f"cpu-only: FAILED {name}:\n  " + message.replace("\n", "\n  "), file=sys.stderr)
    print(f"cpu-only: {len(results) - len(failed)} of {len(results)} checks pass")
    if args.junit:
        write_junit(args.junit, "cpu_only_build",
                    [(name, "failed" if message else "passed", message)
                     for name, message in results])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
