#!/usr/bin/env python3
"""deploy/slurm/downpour-cpu.sbatch run by a real one-node Slurm.

As root, in a temporary folder: a munge key (0600, in a 0700 folder) and
munged in the foreground on a socket of its own; a minimal slurm.conf and
cgroup.conf (one node, `localhost`, with this machine's CPUs; no accounting,
no cgroups: proctrack/linuxproc, task/none; state, spool and PID files in the
folder; slurmctld and slurmd on free ports); slurmctld -D and slurmd -D with
that configuration. Once the node is idle, Fashion-MNIST is imported with
`downpourctl dataset import` and

  sbatch --wait --nodes=1 --ntasks-per-node=2 deploy/slurm/downpour-cpu.sbatch
      SPEC DATA

runs, SPEC being examples/fashion_mnist_mlp.pbtxt with fewer steps (--steps),
the built binaries in DOWNPOUR_BIN, every daemon on mutual TLS (TLS_DIR: the
script makes the certificates). The job must end SUCCEEDED with a test
accuracy (a coordinator, two shards, two workers, each logging its SIGTERM
when the script stops them), and Slurm must record it COMPLETED. Then every
daemon started here is stopped; a process still carrying this run's
SLURM_CONF or naming its folder fails the last case (and is killed).

Not root, fewer than two CPUs or Slurm/munge not installed: every case is
skipped, saying why. The sbatch script fixes the deploy/README.md ports
(7070-7072, 9100-9102, and +100 for a second shard or worker): one in use
fails the run, naming it.

Runs outside `bazel test` (it starts system daemons as root): scripts/test.sh
runs it after the build and counts its cases.
usage: deploy/slurm_test.py --bin BAZEL_BIN [--junit OUT.xml] [--steps N]
"""
import argparse
import ctypes
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

DEPLOY = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DEPLOY)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from junit import report  # noqa: E402

SBATCH = os.path.join("deploy", "slurm", "downpour-cpu.sbatch")
BINARIES = ("coordinator/downpour-coordinator", "server/downpour-ps", "worker/downpour-worker",
            "client/downpourctl")
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "srun")
FASHION = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
# The ports downpour-cpu.sbatch gives a coordinator, 2 shards and 2 workers.
DOWNPOUR_PORTS = (7070, 9100, 7071, 9101, 7171, 9201, 7072, 9102, 7172, 9202)
NODE = "localhost"
JOB_TIMEOUT_S = 180


class Skip(Exception):
    """The run cannot happen here; the message says why."""


class Failure(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def tail(path, lines=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def adopt_orphans():
    """Makes this process the parent of any orphaned descendant (a daemon that
    forks away from its parent), so none can escape the cleanup unseen."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def why_skip():
    if os.geteuid() != 0:
        return "not root: slurmd and munged must run as root"
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        return (f"Slurm or munge is not installed ({', '.join(missing)} missing; Debian's "
                "slurm-wlm and munge, which scripts/install-deps.sh --test installs)")
    if (os.cpu_count() or 1) < 2:
        return "fewer than 2 CPUs: the job runs 2 worker tasks of 1 CPU each"
    return None


class SlurmRun:
    def __init__(self, args):
        self.args = args
        self.scratch = tempfile.mkdtemp(prefix="downpour-slurm.")
        # munged wants its socket's folders searchable by all.
        os.chmod(self.scratch, 0o755)
        self.conf = os.path.join(self.scratch, "slurm.conf")
        self.socket = os.path.join(self.scratch, "munge-run", "munge.socket")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        self.env["SLURM_CONF"] = self.conf
        self.daemons = {}  # name -> Popen, in start order
        self.logs = {}
        self.job_id = None

    # ---- the cluster

    def start(self):
        self.write_munge_key()
        self.spawn("munged", ["munged", "--foreground", f"--socket={self.socket}",
                              f"--key-file={self.munge_dir}/munge.key",
                              f"--log-file={self.munge_dir}/munged.log",
                              f"--pid-file={self.munge_dir}/munged.pid",
                              f"--seed-file={self.munge_dir}/munged.seed"])
        self.wait_until("munged's socket", lambda: os.path.exists(self.socket), 20)
        self.write_slurm_conf()
        self.spawn("slurmctld", ["slurmctld", "-D", "-f", self.conf])
        self.spawn("slurmd", ["slurmd", "-D", "-f", self.conf, "-N", NODE])
        self.wait_until(f"node {NODE} to be idle", self.node_idle, 60)
        return [f"node {NODE} idle, {os.cpu_count()} CPUs"]

    def write_munge_key(self):
        self.munge_dir = os.path.join(self.scratch, "munge")
        os.makedirs(self.munge_dir, mode=0o700)
        os.makedirs(os.path.dirname(self.socket), mode=0o755)
        fd = os.open(os.path.join(self.munge_dir, "munge.key"), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                     0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))

    def write_slurm_conf(self):
        s = self.scratch
        for d in ("state", "spool"):
            os.makedirs(os.path.join(s, d), mode=0o700)
        lines = [
            "ClusterName=downpour-test",
            f"SlurmctldHost={NODE}",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "KillWait=5",  # a cancelled run's tasks get SIGKILL 5 s after SIGTERM
            f"SlurmctldPidFile={s}/slurmctld.pid",
            f"SlurmdPidFile={s}/slurmd.pid",
            f"StateSaveLocation={s}/state",
            f"SlurmdSpoolDir={s}/spool",
            f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN",
            f"PartitionName=test Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        ]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        # Read by slurmd; nothing is constrained (task/none), and no systemd
        # is asked for a cgroup where it is v2.
        with open(os.path.join(s, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=autodetect\nIgnoreSystemd=yes\n")

    def spawn(self, name, argv, env=None):
        self.logs[name] = os.path.join(self.scratch, f"{name}.log")
        with open(self.logs[name], "wb") as log:
            self.daemons[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                  env=env or self.env, cwd=self.scratch)

    def wait_until(self, what, ready, seconds):
        deadline = time.monotonic() + seconds
        while not ready():
            for name, p in self.daemons.items():
                if p.poll() is not None:
                    raise Failure(f"{name} exited with {p.returncode} while waiting for {what}:\n"
                                  + tail(self.logs[name]))
            if time.monotonic() > deadline:
                raise Failure(f"timed out after {seconds} s waiting for {what}:\n" + self.daemon_logs())
            time.sleep(0.2)

    def slurm(self, *argv, timeout=30):
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def node_idle(self):
        out = self.slurm("scontrol", "-o", "show", "node", NODE)
        m = re.search(r"\bState=(\S+)", out.stdout)
        return out.returncode == 0 and m is not None and m.group(1) == "IDLE"

    # ---- the job

    def train(self):
        bazel_bin = self.args.bin
        bin_dir = os.path.join(self.scratch, "bin")
        os.makedirs(bin_dir)
        for path in BINARIES:
            binary = os.path.join(bazel_bin, path)
            if not os.access(binary, os.X_OK):
                raise Failure(f"{path} is not built under {bazel_bin}")
            os.symlink(os.path.realpath(binary), os.path.join(bin_dir, os.path.basename(path)))
        busy = [p for p in DOWNPOUR_PORTS if port_in_use(p)]
        if busy:
            raise Failure(f"port(s) {busy} in use: {SBATCH} listens on the README's fixed ports")
        host = socket.gethostname()
        try:
            socket.gethostbyname(host)
        except OSError:
            raise Failure(f"this host's name {host!r} does not resolve: {SBATCH} advertises "
                          "workers by it") from None
        if not glob.glob(os.path.join(FASHION, "*.gz")):
            raise Failure(f"no Fashion-MNIST under {FASHION} (scripts/install-deps.sh installs "
                          "dataset-fashion-mnist)")
        data = os.path.join(self.scratch, "data")
        imported = subprocess.run(
            [os.path.join(bin_dir, "downpourctl"), "dataset", "import", f"--fashion_mnist={FASHION}",
             f"--out_dir={data}/fashion-mnist", "--shards=2"],
            capture_output=True, text=True, timeout=300)
        if imported.returncode:
            raise Failure("dataset import failed: " + imported.stderr[-800:])
        with open(os.path.join(ROOT, "examples", "fashion_mnist_mlp.pbtxt")) as f:
            spec, n = re.subn(r"(?m)^steps: \d+$", f"steps: {self.args.steps}", f.read())
        if n != 1:
            raise Failure("examples/fashion_mnist_mlp.pbtxt has no line 'steps: N'")
        spec_path = os.path.join(self.scratch, "fashion_mnist_mlp.pbtxt")
        with open(spec_path, "w") as f:
            f.write(spec)

        run_dir = os.path.join(self.scratch, "job")
        output = os.path.join(self.scratch, "job.out")
        # On mutual TLS, as a real cluster runs: the script makes the
        # certificates (scripts/make-certs.sh) for every daemon it starts.
        env = dict(self.env, DOWNPOUR_BIN=bin_dir, RUN_DIR=run_dir,
                   TLS_DIR=os.path.join(self.scratch, "tls"),
                   MAKE_CERTS=os.path.join(ROOT, "scripts", "make-certs.sh"))
        argv = ["sbatch", "--wait", "--parsable", "--nodes=1", "--ntasks-per-node=2",
                f"--time={JOB_TIMEOUT_S // 60}", f"--output={output}", SBATCH, spec_path, data]
        started = time.monotonic()
        try:
            job = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                                 timeout=JOB_TIMEOUT_S + 30)
        except subprocess.TimeoutExpired:
            raise Failure(f"sbatch --wait still waiting after {JOB_TIMEOUT_S + 30} s:\n"
                          + tail(output) + self.job_logs(run_dir)) from None
        wall = time.monotonic() - started
        self.job_id = job.stdout.split(";")[0].strip() or None
        result = tail(output, 200)
        m = re.search(r"SUCCEEDED steps=(\d+) test_accuracy=([\d.]+)", result)
        if job.returncode or not m:
            raise Failure(f"sbatch exited {job.returncode}: {job.stderr.strip()}\n{result[-1500:]}"
                          + self.job_logs(run_dir))
        if int(m.group(1)) != self.args.steps:
            raise Failure(f"the job ran {m.group(1)} steps, not {self.args.steps}")
        # Chance is 0.1; a few hundred steps of this MLP reach about 0.8.
        if float(m.group(2)) < 0.5:
            raise Failure(f"test accuracy {m.group(2)} after {m.group(1)} steps: it did not learn")
        shown = self.slurm("scontrol", "-o", "show", "job", self.job_id or "")
        state = re.search(r"\bJobState=(\S+).*\bExitCode=(\S+)", shown.stdout)
        if not state or state.groups() != ("COMPLETED", "0:0"):
            raise Failure(f"Slurm's record of job {self.job_id}: {shown.stdout.strip() or shown.stderr}")
        logs = sorted(os.listdir(os.path.join(run_dir, "logs")))
        want = ["coordinator.log", "ps0.log", "ps1.log"]
        workers = [n for n in logs if n.startswith("worker-")]
        if [n for n in logs if not n.startswith("worker-")] != want or len(workers) != 2:
            raise Failure(f"daemon logs {logs}: wanted {want} and 2 workers'")
        unstopped = [n for n in logs if "SIGTERM received" not in tail(os.path.join(run_dir, "logs", n), 50)]
        if unstopped:
            raise Failure(f"no 'SIGTERM received' in {unstopped}: the script did not stop them in order"
                          + self.job_logs(run_dir))
        coordinator_log = tail(os.path.join(run_dir, "logs", "coordinator.log"), 200)
        if "TLS, callers authorized by --auth_config" not in coordinator_log:
            raise Failure("the coordinator did not serve mutual TLS with --auth_config:\n"
                          + coordinator_log[-1500:])
        return [m.group(0), f"slurm job {self.job_id} COMPLETED in {wall:.1f} s, on mutual TLS"]

    def job_logs(self, run_dir):
        folder = os.path.join(run_dir, "logs")
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        return "".join(f"\n--- {n}\n" + tail(os.path.join(folder, n), 10) for n in names) + \
            "\n" + self.daemon_logs()

    def daemon_logs(self):
        return "".join(f"--- {name}\n{tail(path, 10)}" for name, path in self.logs.items())

    # ---- stopping

    def stop(self):
        """Cancels what runs, stops the daemons (last started first), kills any
        process left with this run's configuration. Returns what was left."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            self.slurm("scancel", "--full", "--user=root")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                queue = self.slurm("squeue", "--noheader", "--format=%i")
                if queue.returncode or not queue.stdout.strip():
                    break
                time.sleep(0.2)
        for name, p in reversed(list(self.daemons.items())):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        left = self.leftovers()
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reap_children()
        return left

    def leftovers(self):
        left = []
        marker = f"SLURM_CONF={self.conf}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = f.read()
                with open(f"/proc/{entry}/stat") as f:
                    zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
            except OSError:
                continue  # gone, or a kernel thread
            if zombie:
                continue
            if marker in environ.split(b"\0") or self.scratch.encode() in cmdline:
                left.append((int(entry), cmdline.replace(b"\0", b" ").decode(errors="replace").strip()))
        return left

    def clean(self):
        shutil.rmtree(self.scratch, ignore_errors=True)


def reap_children():
    """Waits for orphans adopted through adopt_orphans that have exited."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default=os.path.join(ROOT, "bazel-bin"), help="bazel-bin")
    parser.add_argument("--junit", help="write the results as JUnit XML here")
    parser.add_argument("--steps", type=int, default=300, help="training steps of the job")
    args = parser.parse_args()
    names = ("slurm: munged, slurmctld and slurmd start from a private configuration; the node is idle",
             f"slurm: sbatch --wait {SBATCH} trains Fashion-MNIST: SUCCEEDED with a test accuracy",
             "slurm: every daemon started is stopped; no process of the run is left")
    results = []  # (name, status, message)
    reason = why_skip()
    if reason:
        results = [(name, "skipped", reason) for name in names]
    else:
        adopt_orphans()
        # SIGTERM (a CI runner giving up) unwinds through the cleanup too.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        run = SlurmRun(args)
        try:
            for name, case in zip(names[:2], (run.start, run.train)):
                if results and results[-1][1] != "passed":
                    results.append((name, "failed", "not run: the cluster did not come up"))
                    continue
                try:
                    results.append((name, "passed", "; ".join(case())))
                except (Failure, OSError, subprocess.SubprocessError) as e:
                    results.append((name, "failed", str(e) or type(e).__name__))
        finally:
            left = run.stop()
            run.clean()
        results.append((names[2], "failed" if left else "passed",
                        "left running (killed): " + "; ".join(f"{pid} {cmd}" for pid, cmd in left)
                        if left else ""))
    return 1 if report("slurm", results, args.junit) else 0


if __name__ == "__main__":
    sys.exit(main())
