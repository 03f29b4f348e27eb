"""TensorBoard reads the event files the coordinator writes for each job.

Starts the real daemons on loopback (tests/export_numpy_test.py's cluster:
one coordinator, two shards, two workers), submits a long Fashion-MNIST MLP
job (evaluated every 100 steps) and, while it runs, reads
STATE_DIR/tensorboard/JOB_ID/ with PyPI tensorboard's EventAccumulator until
`loss`, `examples_per_second` and `test_accuracy` each have a few points: so
points reach the file while the job trains. Each tag's steps must rise and its
values be sane (finite positive loss, positive rate, accuracy in (0.1, 1]).
The job is then stopped and its events read once more. (A coordinator
restart adding a file beside the first is covered by
control/coordinator_operations_test.)

Run by scripts/test.sh with the venv of scripts/python-deps.sh, after the
build; writes JUnit XML for scripts/count_tests.py. Without tensorboard it
reports itself skipped, with the reason.
usage: tensorboard_test.py --bin BAZEL_BIN --junit OUT.xml
"""
import argparse
import math
import os
import re
import sys
import tempfile
import time

from export_numpy_test import FASHION, ROOT, Cluster, run_cases

JOB = "tb-mlp"
TAGS = ("loss", "examples_per_second", "test_accuracy")
WANTED = {"loss": 3, "examples_per_second": 3, "test_accuracy": 2}
# Generous: how long the job may take to reach WANTED on a slow machine.
DEADLINE_S = 600


def long_job_spec(work):
    with open(os.path.join(ROOT, "examples/fashion_mnist_mlp.pbtxt")) as f:
        text = f.read()
    text = re.sub(r"(?m)^steps: \d+$", "steps: 1000000", text)
    text = re.sub(r"(?m)^log_every_steps: \d+$", "log_every_steps: 20", text)
    text += "eval_every_steps: 100\n"
    path = os.path.join(work, "long_mlp.pbtxt")
    with open(path, "w") as f:
        f.write(text)
    return path


def read_scalars(job_dir):
    """{tag: [(step, value)]} over every event file of the job's directory."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(job_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags().get("scalars", [])
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in tags}


def check_series(series, wanted):
    for tag in TAGS:
        points = series.get(tag, [])
        if len(points) < wanted[tag]:
            raise AssertionError(f"{tag}: {len(points)} points, wanted {wanted[tag]}: {series}")
        steps = [s for s, _ in points]
        if any(b <= a for a, b in zip(steps, steps[1:])):
            raise AssertionError(f"{tag}: steps do not rise: {steps}")
        for step, value in points:
            if not math.isfinite(value):
                raise AssertionError(f"{tag} at step {step} is {value}")
        if tag == "loss" and not all(0 < v < 10 for _, v in points):
            raise AssertionError(f"loss out of (0, 10): {points}")
        if tag == "examples_per_second" and not all(v > 0 for _, v in points):
            raise AssertionError(f"examples_per_second not positive: {points}")
        if tag == "test_accuracy" and not all(0.1 < v <= 1 for _, v in points):
            raise AssertionError(f"test_accuracy out of (0.1, 1]: {points}")


def run(cluster, state_dir):
    job_dir = os.path.join(state_dir, "tensorboard", JOB)
    cluster.ctl("submit", long_job_spec(cluster.work), "--job_id=" + JOB)
    deadline = time.time() + DEADLINE_S
    series = {}
    while True:
        if os.path.isdir(job_dir):
            series = read_scalars(job_dir)
            if all(len(series.get(t, [])) >= WANTED[t] for t in TAGS):
                break
        if "RUNNING" not in cluster.ctl("get", JOB):
            raise AssertionError(f"job {JOB} is no longer running: {cluster.ctl('get', JOB)}")
        if time.time() > deadline:
            raise AssertionError(f"after {DEADLINE_S}s the event files hold only {series}")
        time.sleep(1)
    check_series(series, WANTED)
    print("while running: " + ", ".join(f"{t} {len(series[t])} points up to step "
                                        f"{series[t][-1][0]}" for t in TAGS))
    cluster.ctl("stop", JOB)
    after = read_scalars(job_dir)
    check_series(after, WANTED)
    print(f"{JOB}: {len(os.listdir(job_dir))} event file(s); final loss "
          f"{after['loss'][-1][1]:.3f}, accuracy {after['test_accuracy'][-1][1]:.3f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--junit", required=True)
    args = parser.parse_args()
    skip_reason = None
    try:
        from tensorboard.backend.event_processing import event_accumulator  # noqa: F401
    except ImportError as e:
        skip_reason = f"tensorboard missing ({e}); scripts/python-deps.sh installs it"
    if skip_reason is None and not os.path.isdir(FASHION):
        skip_reason = f"no Fashion-MNIST in {FASHION}"
    work = tempfile.mkdtemp(prefix="downpour-tensorboard-")
    cluster = Cluster(args.bin, work)
    return run_cases("tensorboard_test", "TensorBoardTest", args.junit, cluster, skip_reason,
                     lambda: None,
                     [("event_files", lambda _, __: run(cluster, os.path.join(work, "state")))])


if __name__ == "__main__":
    sys.exit(main())
