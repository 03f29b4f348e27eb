"""Chaos run: jobs through the real daemons while processes are killed.

Starts a local cluster with a checkpoint root (one coordinator, --shards
shards, --workers workers), submits --jobs Fashion-MNIST MLP jobs (SYNC and
ASYNC alternately, checkpoints every 100 steps, up to 10 restarts in a row
without progress), and until every job has ended (or --minutes pass) injects
a fault every --fault_every (3-8) s into a random shard or worker:
kill -9 (a replacement of the same kind starts 0-3 s later), SIGTERM (it
drains; a replacement starts 0-3 s later) or SIGSTOP for 3-6 s (past the
node timeout) then SIGCONT; with --coordinator_faults, now and then the
coordinator too (kill -9, restarted 1-5 s later; --recovery_grace_s=20). A lost worker's rank goes
on elsewhere without a rollback (a free worker takes it over, or after
--handover_wait_s=5 its data and steps are dealt to the live ranks); a lost shard rolls its jobs back to their
checkpoint; a draining shard's jobs move after a fresh one. Prints one JSON
line:
  faults_injected, jobs_succeeded, jobs_total,
  steps_lost_p50, steps_lost_max   (per restart or move: the step the job
                                    had reached minus the checkpoint it
                                    continued from),
  recovery_s_p50, recovery_s_p99   (a fault to the job running again),
  rank_handovers, handover_s_p50   (lost worker ranks taken over, and a
                                    fault to the take-over),
  data_handouts                    (lost ranks whose data went to live ranks),
  partial_shard_restores           (ASYNC jobs that had only a lost shard's
                                    partitions restored, on a spare),
  corrupt_checkpoints_loaded       (restores a shard found damaged after the
                                    coordinator chose them; must be 0).
Not in CI (minutes). usage:
  bazel build -c opt //coordinator/... //server/... //worker/... //client/...
  python3 bench/chaos.py [--bin bazel-bin] [--jobs 4] [--minutes 6] [--seed 1]
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")

SPEC = """
name: "chaos"
model {{
  input_shape: [28, 28, 1]
  num_classes: 10
  layer {{ name: "flat" flatten {{}} }}
  layer {{ name: "fc1" dense {{ units: 128 }} }}
  layer {{ name: "relu1" relu {{}} }}
  layer {{ name: "logits" dense {{ units: 10 }} }}
  layer {{ name: "loss" softmax_cross_entropy {{}} }}
}}
dataset {{
  train_files: "fashion-mnist/train-*.tfrecord"
  test_files: "fashion-mnist/test-*.tfrecord"
  batch_size: 64
  shuffle_buffer: 2000
}}
optimizer {{ kind: ADAM learning_rate: 0.002 }}
consistency {{ mode: {mode} }}
num_workers: 2
num_shards: 2
steps: {steps}
log_every_steps: 20
seed: {seed}
checkpoint {{ every_steps: 100 keep: 2 }}
restart {{ max_restarts: 10 backoff_seconds: 1 }}
"""


def percentile(values, q):
    if not values:
        return 0
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


class Cluster:
    def __init__(self, bin_dir, work):
        self.bin, self.work = bin_dir, work
        self.root = os.path.join(work, "checkpoints")
        self.data = os.path.join(work, "data")
        self.procs = {}  # name -> Popen
        self.counter = {"ps": 0, "worker": 0}
        self.coordinator = None

    def spawn(self, name, binary, flags):
        port_file = os.path.join(self.work, name + ".port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        log = open(os.path.join(self.work, name + ".log"), "a")
        self.procs[name] = subprocess.Popen(
            [os.path.join(self.bin, binary), "--port_file=" + port_file, *flags],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not (os.path.exists(port_file) and os.path.getsize(port_file) > 0):
            if time.time() > deadline or self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} did not start; see {log.name}")
            time.sleep(0.05)
        return open(port_file).read().strip()

    def start_coordinator(self, listen="127.0.0.1:0"):
        self.coordinator = self.spawn(
            "coordinator", "coordinator/downpour-coordinator",
            ["--listen=" + listen, "--state_dir=" + os.path.join(self.work, "state"),
             "--checkpoint_root=" + self.root, "--heartbeat_interval_ms=200",
             "--node_timeout_ms=2000",
             # Live nodes find a restarted coordinator within ~2 s (their
             # reconnect back-off); the 10-minute default would let a node
             # killed during an outage hold its jobs that long.
             "--recovery_grace_s=20", "--handover_wait_s=5"])

    def add(self, kind):
        name = f"{kind}{self.counter[kind]}"
        self.counter[kind] += 1
        flags = ["--listen=127.0.0.1:0", "--coordinator=" + self.coordinator]
        if kind == "ps":
            self.spawn(name, "server/downpour-ps", flags + ["--checkpoint_root=" + self.root])
        else:
            self.spawn(name, "worker/downpour-worker", flags + ["--data_dir=" + self.data])
        return name

    def ctl(self, *args, check=True):
        r = subprocess.run([os.path.join(self.bin, "client/downpourctl"),
                            "--coordinator=" + self.coordinator, *args],
                           capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise RuntimeError(f"downpourctl {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def job(self, job_id):
        try:
            return json.loads(self.ctl("-o", "json", "get", job_id))
        except (RuntimeError, ValueError, subprocess.TimeoutExpired):
            return None

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.path.join(ROOT, "bazel-bin"))
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--workers", type=int, default=5)
    parser.add_argument("--minutes", type=float, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--coordinator_faults", action="store_true")
    parser.add_argument("--fault_every", default="3-8",
                        help="seconds between faults: a range MIN-MAX drawn uniformly")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    low, high = (float(x) for x in args.fault_every.split("-"))
    work = tempfile.mkdtemp(prefix="downpour-chaos-")
    cluster = Cluster(args.bin, work)
    faults = []  # (time, description)
    try:
        subprocess.run([os.path.join(args.bin, "client/downpourctl"), "dataset", "import",
                        "--fashion_mnist=" + FASHION,
                        "--out_dir=" + os.path.join(cluster.data, "fashion-mnist"),
                        "--shards=4"], check=True, capture_output=True)
        cluster.start_coordinator()
        for _ in range(args.shards):
            cluster.add("ps")
        for _ in range(args.workers):
            cluster.add("worker")
        jobs = []
        for j in range(args.jobs):
            spec = os.path.join(work, f"job{j}.pbtxt")
            with open(spec, "w") as f:
                f.write(SPEC.format(mode="SYNC" if j % 2 == 0 else "ASYNC", steps=args.steps,
                                    seed=j + 1))
            cluster.ctl("submit", spec, f"--job_id=chaos-{j}")
            jobs.append(f"chaos-{j}")
        deadline = time.time() + args.minutes * 60
        next_fault = time.time() + rng.uniform(low, high)
        stopped = {}  # name -> time to SIGCONT
        replacements = []  # (time, kind)
        while time.time() < deadline:
            now = time.time()
            for name, when in list(stopped.items()):
                if now >= when:
                    cluster.procs[name].send_signal(signal.SIGCONT)
                    del stopped[name]
            for when, kind in list(replacements):
                if now >= when:
                    replacements.remove((when, kind))
                    if kind == "coordinator":
                        cluster.start_coordinator(cluster.coordinator)
                    else:
                        cluster.add(kind)
            states = [(cluster.job(j) or {}).get("state") for j in jobs]
            if all(s in ("SUCCEEDED", "FAILED", "STOPPED") for s in states):
                break
            if now >= next_fault and not any(k == "coordinator" for _, k in replacements):
                live = [n for n, p in cluster.procs.items()
                        if p.poll() is None and n not in stopped and n != "coordinator"]
                if args.coordinator_faults and rng.random() < 0.1:
                    cluster.procs["coordinator"].kill()
                    cluster.procs["coordinator"].wait()
                    replacements.append((now + rng.uniform(1, 5), "coordinator"))
                    faults.append((now, "kill -9 coordinator"))
                elif live:
                    victim = rng.choice(live)
                    kind = "ps" if victim.startswith("ps") else "worker"
                    draw = rng.random()
                    if draw < 0.55:
                        cluster.procs[victim].kill()
                        cluster.procs[victim].wait()
                        replacements.append((now + rng.uniform(0, 3), kind))
                        faults.append((now, f"kill -9 {victim}"))
                    elif draw < 0.75:
                        # It drains and exits on its own (a shard once its
                        # jobs have moved).
                        cluster.procs[victim].terminate()
                        replacements.append((now + rng.uniform(0, 3), kind))
                        faults.append((now, f"SIGTERM {victim}"))
                    else:
                        cluster.procs[victim].send_signal(signal.SIGSTOP)
                        stopped[victim] = now + rng.uniform(3, 6)
                        faults.append((now, f"SIGSTOP {victim}"))
                print(f"[{time.strftime('%H:%M:%S')}] {faults[-1][1]}", file=sys.stderr)
                next_fault = now + rng.uniform(low, high)
            time.sleep(0.2)
        for name in stopped:
            cluster.procs[name].send_signal(signal.SIGCONT)
        # A coordinator killed just before the end comes back to report.
        if any(kind == "coordinator" for _, kind in replacements):
            cluster.start_coordinator(cluster.coordinator)

        # Results, from the jobs' events.
        final = {j: cluster.job(j) or {} for j in jobs}
        lost, recovery, handovers, partial, handouts = [], [], [], 0, 0
        fault_times = sorted(t for t, _ in faults)
        for j, job in final.items():
            events = job.get("events", [])
            for i, e in enumerate(events):
                if "the other shards keep theirs" in e["message"]:
                    partial += 1
                    continue
                if "not taken over within" in e["message"]:
                    handouts += 1
                    continue
                if "taken over by worker node" in e["message"]:
                    taken = int(e["time_ms"])
                    cause = max((t for t in fault_times if t * 1000 <= taken), default=None)
                    if cause is not None:
                        handovers.append(taken / 1000 - cause)
                    continue
                m = re.search(r"restart \d+ \((?:\d+ of \d+ in a row|a move, not counted)\) .*at "
                              r"step (\d+), continues (?:from the checkpoint at step (\d+)|from the "
                              r"start)", e["message"])
                if not m:
                    continue
                lost.append(int(m.group(1)) - int(m.group(2) or 0))
                restart_ms = int(e["time_ms"])
                started = next((int(x["time_ms"]) for x in events[i + 1:]
                                if x["message"].startswith("started again")), None)
                cause = max((t for t in fault_times if t * 1000 <= restart_ms), default=None)
                if started is not None and cause is not None:
                    recovery.append(started / 1000 - cause)
        corrupt = 0
        for name in os.listdir(work):
            if name.startswith("ps") and name.endswith(".log"):
                corrupt += len(re.findall(r"cannot host: .*damaged",
                                          open(os.path.join(work, name)).read()))
        succeeded = sum(1 for job in final.values() if job.get("state") == "SUCCEEDED")
        for j, job in final.items():
            print(f"{j}: {job.get('state')} test_accuracy={job.get('test_accuracy')} "
                  f"restarts={job.get('restarts', 0)} {job.get('message', '')}", file=sys.stderr)
        print(json.dumps({
            "faults_injected": len(faults), "jobs_succeeded": succeeded, "jobs_total": len(jobs),
            "steps_lost_p50": percentile(lost, 0.5), "steps_lost_max": max(lost, default=0),
            "recovery_s_p50": round(percentile(recovery, 0.5), 2),
            "recovery_s_p99": round(percentile(recovery, 0.99), 2),
            "rank_handovers": len(handovers), "data_handouts": handouts,
            "partial_shard_restores": partial,
            "handover_s_p50": round(percentile(handovers, 0.5), 2),
            "corrupt_checkpoints_loaded": corrupt, "restarts": len(lost),
            "accuracy": {j: job.get("test_accuracy") for j, job in final.items()}}))
        return 0 if succeeded == len(jobs) and corrupt == 0 else 1
    finally:
        cluster.stop()
        keep = os.environ.get("CHAOS_KEEP")
        if keep:
            shutil.copytree(work, keep, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
