"""Soak: many short jobs back to back through the real daemons, and their memory.

Starts a local cluster on loopback (1 coordinator, --shards shards, --workers
workers, CPU; bench/chaos.py's cluster handling), then runs --jobs short jobs
one after another, cycling through the example specs cut to --steps steps:
the Fashion-MNIST MLP in SYNC and in ASYNC, the CNN, and the click-log
(CTR, sparse embeddings) model on a small generated click log. Every
--report_every jobs, and once more after --idle_s seconds with no job, it
samples each daemon: VmRSS and VmHWM (/proc/PID/status), anonymous memory
(/proc/PID/smaps_rollup), what its malloc holds live and free
(downpour_malloc_{in_use,free}_bytes), threads (/proc/PID/task) and the
number of series on its /metrics; every --sample_every jobs it samples,
every --report_every it prints a table. At the end it prints the growth of
each daemon's RSS over the last --window jobs (the median of the window's
first quarter of samples against that of its last quarter: single samples
vary by a few MB with the job just ended) and whether it is under
--limit_pct, and one JSON line with every sample (also written to --json).

With --faults, every --fault_every jobs a fault hits the job while it runs,
in turn: kill -9 of the last worker (restarted under the same name 0.5 s
later), SIGSTOP of a worker past the node timeout then SIGCONT, kill -9 of
the last shard (restarted), SIGSTOP of the other worker. The first worker
and shard and the coordinator are never killed, so they live the whole run
and the growth verdict covers them; a restarted daemon's growth counts only
when its process lived the whole window ("restarted" otherwise).

The coordinator keeps its ended jobs (the durable history and the job
table) up to --job_retention_count by design; the soak sets it to
--retention (default 50) so that its memory is bounded too. Likewise a worker
keeps an ended job's metric series (about 180 on the evaluating rank) for
--job_metrics_grace_s (10 min by default), longer than the whole soak: the
soak sets it to --metrics_grace_s (default 60).

Not in CI (tens of minutes). usage:
  bazel build -c opt //coordinator:downpour-coordinator //server:downpour-ps \
      //worker:downpour-worker //client:downpourctl
  python3 bench/soak.py [--jobs 300] [--report_every 50] [--faults] [--idle_s 120]
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chaos  # noqa: E402  (the cluster handling)

ROOT = chaos.ROOT
KINDS = ["mlp_sync", "mlp_async", "cnn", "ctr"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SoakCluster(chaos.Cluster):
    """chaos.Cluster with /metrics on every daemon, bounded job retention and
    daemons restarted under their own name."""

    def __init__(self, bin_dir, work, retention, metrics_grace_s, node_timeout_ms):
        super().__init__(bin_dir, work)
        self.retention = retention
        self.metrics_grace_s = metrics_grace_s
        self.node_timeout_ms = node_timeout_ms
        self.metrics = {}  # name -> HOST:PORT of /metrics

    def start_coordinator(self, listen="127.0.0.1:0"):
        self.metrics["coordinator"] = f"127.0.0.1:{free_port()}"
        self.coordinator = self.spawn(
            "coordinator", "coordinator/downpour-coordinator",
            ["--listen=" + listen, "--state_dir=" + os.path.join(self.work, "state"),
             "--checkpoint_root=" + self.root, "--heartbeat_interval_ms=200",
             f"--node_timeout_ms={self.node_timeout_ms}", "--handover_wait_s=5",
             f"--job_retention_count={self.retention}",
             "--metrics_listen=" + self.metrics["coordinator"]])

    def add(self, kind, name=None):
        if name is None:
            name = f"{kind}{self.counter[kind]}"
            self.counter[kind] += 1
        self.metrics[name] = f"127.0.0.1:{free_port()}"
        flags = ["--listen=127.0.0.1:0", "--coordinator=" + self.coordinator,
                 "--metrics_listen=" + self.metrics[name]]
        if kind == "ps":
            self.spawn(name, "server/downpour-ps", flags + ["--checkpoint_root=" + self.root])
        else:
            self.spawn(name, "worker/downpour-worker",
                       flags + ["--data_dir=" + self.data, "--devices=cpu",
                                f"--job_metrics_grace_s={self.metrics_grace_s}"])
        return name

    def restart(self, name):
        kind = "ps" if name.startswith("ps") else "worker"
        self.add(kind, name)


def read_kb(path, field):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def scrape(address):
    """The number of series on a daemon's /metrics and what its malloc holds
    live and free, in MB (None where it could not be read)."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None, None, None
    series, held = 0, {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series += 1
        name, _, value = line.partition(" ")
        if name in ("downpour_malloc_in_use_bytes", "downpour_malloc_free_bytes"):
            held[name] = round(float(value) / 2**20, 1)
    return (series, held.get("downpour_malloc_in_use_bytes"),
            held.get("downpour_malloc_free_bytes"))


def sample(cluster):
    """Each live daemon's memory, threads and metric series now."""
    out = {}
    for name, proc in sorted(cluster.procs.items()):
        if proc.poll() is not None:
            continue
        pid = proc.pid
        try:
            threads = len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            threads = None
        series, live, free = scrape(cluster.metrics[name])
        out[name] = {
            "pid": pid,
            "rss_mb": round((read_kb(f"/proc/{pid}/status", "VmRSS") or 0) / 1024, 1),
            "hwm_mb": round((read_kb(f"/proc/{pid}/status", "VmHWM") or 0) / 1024, 1),
            "anon_mb": round((read_kb(f"/proc/{pid}/smaps_rollup", "Anonymous") or 0) / 1024, 1),
            "file_mb": round((read_kb(f"/proc/{pid}/status", "RssFile") or 0) / 1024, 1),
            "threads": threads,
            "malloc_live_mb": live,
            "malloc_free_mb": free,
            "series": series,
        }
    return out


def print_table(label, snapshot):
    print(f"\n{label}", file=sys.stderr)
    def shown(value):
        return "-" if value is None else value

    print(f"  {'daemon':<12}{'pid':>8}{'RSS MB':>9}{'HWM MB':>9}{'anon MB':>9}{'file MB':>9}{'live MB':>9}"
          f"{'free MB':>9}{'threads':>9}{'series':>8}", file=sys.stderr)
    for name, s in snapshot.items():
        print(f"  {name:<12}{s['pid']:>8}{s['rss_mb']:>9}{s['hwm_mb']:>9}{s['anon_mb']:>9}{s['file_mb']:>9}"
              f"{shown(s['malloc_live_mb']):>9}{shown(s['malloc_free_mb']):>9}"
              f"{shown(s['threads']):>9}{shown(s['series']):>8}", file=sys.stderr)


def write_specs(work, steps):
    """The example specs cut to `steps` steps, by kind."""
    def example(name):
        with open(os.path.join(ROOT, "examples", name)) as f:
            return f.read()

    def cut(text, batch=None):
        text = re.sub(r"(?m)^steps: \d+", f"steps: {steps}", text)
        text = re.sub(r"(?m)^log_every_steps: \d+", f"log_every_steps: {max(1, steps // 4)}", text)
        text = re.sub(r"(?m)^eval_every_steps: \d+\n", "", text)
        text = re.sub(r"shuffle_buffer: \d+", "shuffle_buffer: 1000", text)
        # One evaluation at the end, on a quarter of the test set.
        text = re.sub(r'test_files: "fashion-mnist/test-\*', 'test_files: "fashion-mnist/test-00000-*',
                      text)
        if batch is not None:
            text = re.sub(r"batch_size: \d+", f"batch_size: {batch}", text)
        # Both workers and shards take part in every job; a fault costs a
        # restart, not the job.
        text = re.sub(r"(?m)^num_workers: \d+", "num_workers: 2", text)
        text = re.sub(r"(?m)^num_shards: \d+", "num_shards: 2", text)
        return text + "restart { max_restarts: 10 backoff_seconds: 1 }\n"

    specs = {
        "mlp_sync": cut(example("fashion_mnist_mlp.pbtxt")),
        "mlp_async": cut(example("fashion_mnist_mlp_async.pbtxt")),
        "cnn": cut(example("fashion_mnist_cnn.pbtxt"), batch=32),
        "ctr": cut(example("ctr_dlrm.pbtxt"), batch=256),
    }
    paths = {}
    for kind, text in specs.items():
        paths[kind] = os.path.join(work, f"{kind}.pbtxt")
        with open(paths[kind], "w") as f:
            f.write(text)
    return paths


def make_data(bin_dir, data):
    ctl = os.path.join(bin_dir, "client/downpourctl")
    subprocess.run([ctl, "dataset", "import", "--fashion_mnist=" + chaos.FASHION,
                    "--out_dir=" + os.path.join(data, "fashion-mnist"), "--shards=4",
                    "--limit=8000"], check=True, capture_output=True)
    subprocess.run([ctl, "dataset", "generate", "--kind=ctr",
                    "--out_dir=" + os.path.join(data, "ctr"), "--name=ctr", "--examples=20000",
                    "--test_examples=2000", "--shards=2", "--vocabulary=100:10000"],
                   check=True, capture_output=True)


FAULTS = ["kill worker", "stop worker", "kill ps", "stop other worker"]


def inject(cluster, fault, node_timeout_ms, log):
    """Runs `fault` on the cluster (returns when the victim is back)."""
    workers = sorted(n for n in cluster.procs if n.startswith("worker"))
    shards = sorted(n for n in cluster.procs if n.startswith("ps"))
    if fault == "kill worker" or fault == "kill ps":
        victim = (workers if fault == "kill worker" else shards)[-1]
        cluster.procs[victim].kill()
        cluster.procs[victim].wait()
        time.sleep(0.5)
        cluster.restart(victim)
        log(f"kill -9 {victim}, restarted")
    else:
        victim = workers[-1] if fault == "stop worker" else workers[0]
        cluster.procs[victim].send_signal(signal.SIGSTOP)
        time.sleep(node_timeout_ms / 1000 + 1)
        cluster.procs[victim].send_signal(signal.SIGCONT)
        log(f"SIGSTOP {victim} for {node_timeout_ms / 1000 + 1:.0f} s, SIGCONT")


def growth(samples, window, limit_pct):
    """Each daemon's RSS growth over the last `window` jobs.

    What a daemon keeps resident between jobs varies by a few MB from one
    job to the next (freed memory at the top of an arena, the job just
    ended): one sample against another measures that. So the verdict
    compares the median of the samples in the window's first quarter with
    the median of those in its last quarter; the end points are reported
    beside it."""
    last = samples[-1]
    start_job = last["job"] - window
    inside = [s for s in samples if s["job"] >= start_job and s["label"] != "idle"]
    quarter = max(1, len(inside) // 4)
    result = {}
    for name, now in last["daemons"].items():
        lived = [s["daemons"].get(name) for s in inside]
        if any(d is None or d["pid"] != now["pid"] for d in lived):
            result[name] = {"verdict": "restarted in the window"}
            continue
        then = statistics.median(d["rss_mb"] for d in lived[:quarter])
        later = statistics.median(d["rss_mb"] for d in lived[-quarter:])
        pct = 100.0 * (later - then) / then
        result[name] = {"from_job": inside[0]["job"], "from_mb": lived[0]["rss_mb"],
                        "to_mb": now["rss_mb"], "samples": len(lived),
                        "first_quarter_median_mb": then, "last_quarter_median_mb": later,
                        "growth_pct": round(pct, 1),
                        "verdict": "ok" if pct < limit_pct else "GROWS"}
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.path.join(ROOT, "bazel-bin"))
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--report_every", type=int, default=50,
                        help="jobs between printed tables")
    parser.add_argument("--sample_every", type=int, default=5,
                        help="jobs between samples")
    parser.add_argument("--window", type=int, default=200,
                        help="jobs the growth verdict spans (the last this many)")
    parser.add_argument("--limit_pct", type=float, default=5.0)
    parser.add_argument("--idle_s", type=float, default=120,
                        help="seconds with no job before the last sample")
    parser.add_argument("--settle_s", type=float, default=2,
                        help="seconds after a job ends before a sample is taken")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--retention", type=int, default=50,
                        help="the coordinator's --job_retention_count")
    parser.add_argument("--metrics_grace_s", type=int, default=60,
                        help="the workers' --job_metrics_grace_s")
    parser.add_argument("--faults", action="store_true")
    parser.add_argument("--fault_every", type=int, default=10)
    parser.add_argument("--job_timeout_s", type=float, default=300)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="job kinds to cycle through: " + ", ".join(KINDS))
    parser.add_argument("--json", default="", help="also write the samples here")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    for kind in kinds:
        if kind not in KINDS:
            parser.error(f"--kinds: unknown kind '{kind}'; kinds are {', '.join(KINDS)}")
    node_timeout_ms = 2000
    work = tempfile.mkdtemp(prefix="downpour-soak-")
    cluster = SoakCluster(args.bin, work, args.retention, args.metrics_grace_s, node_timeout_ms)
    started = time.time()

    def log(message):
        print(f"[{time.strftime('%H:%M:%S')} +{time.time() - started:.0f}s] {message}",
              file=sys.stderr, flush=True)

    samples, outcomes, faults = [], {}, []
    try:
        make_data(args.bin, cluster.data)
        specs = write_specs(work, args.steps)
        cluster.start_coordinator()
        for _ in range(args.shards):
            cluster.add("ps")
        for _ in range(args.workers):
            cluster.add("worker")
        ctl = os.path.join(args.bin, "client/downpourctl")
        samples.append({"label": "start", "job": 0, "time_s": 0, "daemons": sample(cluster)})
        print_table("after start", samples[-1]["daemons"])
        for j in range(1, args.jobs + 1):
            kind = kinds[(j - 1) % len(kinds)]
            job_id = f"soak-{j}-{kind.replace('_', '-')}"
            cluster.ctl("submit", specs[kind], f"--job_id={job_id}")
            waiter = subprocess.Popen(
                [ctl, "--coordinator=" + cluster.coordinator, "-o", "json", "wait", job_id,
                 f"--timeout={int(args.job_timeout_s)}s"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            if args.faults and j % args.fault_every == 0:
                fault = FAULTS[(j // args.fault_every - 1) % len(FAULTS)]
                time.sleep(1.0)  # Into the job.
                inject(cluster, fault, node_timeout_ms, log)
                faults.append({"job": j, "fault": fault})
            out, _ = waiter.communicate()
            try:
                state = json.loads(out).get("state", "?")
            except ValueError:
                state = "TIMED_OUT"
                cluster.ctl("stop", job_id, check=False)
            outcomes[state] = outcomes.get(state, 0) + 1
            if state != "SUCCEEDED":
                log(f"job {job_id}: {state}")
            if j % args.sample_every == 0 or j == args.jobs:
                # Between jobs, as a daemon is most of its life: the workers
                # have dropped the run (next heartbeat) and cleaned up.
                time.sleep(args.settle_s)
                samples.append({"label": f"job {j}", "job": j,
                                "time_s": round(time.time() - started),
                                "daemons": sample(cluster)})
            if j % args.report_every == 0 or j == args.jobs:
                print_table(f"after job {j} ({time.time() - started:.0f} s, {outcomes})",
                            samples[-1]["daemons"])
        log(f"idle for {args.idle_s:.0f} s")
        time.sleep(args.idle_s)
        samples.append({"label": "idle", "job": args.jobs, "time_s": round(time.time() - started),
                        "daemons": sample(cluster)})
        print_table(f"after {args.idle_s:.0f} s idle", samples[-1]["daemons"])

        verdict = growth(samples[:-1], args.window, args.limit_pct)
        print(f"\nRSS growth over the last {args.window} jobs (limit {args.limit_pct}%):",
              file=sys.stderr)
        for name, g in verdict.items():
            if "growth_pct" in g:
                print(f"  {name:<12} median {g['first_quarter_median_mb']:>7} -> "
                      f"{g['last_quarter_median_mb']:>7} MB ({g['growth_pct']:+.1f}%; "
                      f"{g['samples']} samples from job {g['from_job']}; ends "
                      f"{g['from_mb']} -> {g['to_mb']} MB): {g['verdict']}", file=sys.stderr)
            else:
                print(f"  {name:<12} {g['verdict']}", file=sys.stderr)
        result = {"jobs": args.jobs, "steps": args.steps, "kinds": kinds,
                  "faults": faults, "outcomes": outcomes, "samples": samples,
                  "growth": verdict, "retention": args.retention,
                  "seconds": round(time.time() - started)}
        print(json.dumps(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        ok = all(g["verdict"] in ("ok", "restarted in the window") for g in verdict.values())
        return 0 if ok else 1
    finally:
        cluster.stop()
        keep = os.environ.get("SOAK_KEEP")
        if keep:
            shutil.copytree(work, keep, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
