#!/usr/bin/env python3
"""The layering of docs/architecture.md, checked over the build graph.

Each rule is a `bazel query` that must come back empty (a forbidden edge is
printed with the path that makes it), plus two checks over the sources:
which #include lines the network-free and backend layers may have, and that
no source file reaches 1,000 lines. Bazel's visibility already refuses most
forbidden edges at build time; these rules pin the ones visibility cannot
express (what a daemon links transitively, what tests may reach) and keep
visibility from being widened to make a build pass.

Runs outside `bazel test` (a test cannot query the workspace it is built
in): scripts/test.sh runs it and counts its rules with the suite.
usage: tests/layering_test.py [--junit FILE]
"""
import argparse
import os
import re
import subprocess
import sys

from junit import write_junit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Libraries and binaries (not tests): what ships in a daemon.
def shipped(pattern):
    return f'kind("cc_library|cc_binary", {pattern}) except attr(testonly, 1, {pattern})'

DAEMONS = {
    "server": "//server:downpour-ps",
    "worker": "//worker:downpour-worker",
    "coordinator": "//coordinator:downpour-coordinator",
    "client": "//client:downpourctl",
}

# The coordinator's collaborators (control/coordinator_state.h): each owns
# its state; none reaches the facade or another collaborator, but for
# JobHistory, which records the events they add to jobs.
COLLABORATORS = ["node_registry", "job_table", "job_history", "checkpoint_orchestrator",
                 "rank_handover"]


def collaborators_apart():
    terms = []
    for name in COLLABORATORS:
        others = [f"//control:{o}" for o in COLLABORATORS if o not in (name, "job_history")]
        terms.append(f"(deps(//control:{name}) intersect (//control:coordinator_state + " +
                     " + ".join(others) + "))")
    return " + ".join(terms)


RULES = [
    # name, query that must be empty
    ("the coordinator's collaborators never reach the facade or each other (JobHistory aside)",
     collaborators_apart()),
    ("daemons never depend on each other",
     " + ".join(f"(deps({target}) intersect (" +
                " + ".join(f"//{other}/..." for other in DAEMONS if other != name) + "))"
                for name, target in DAEMONS.items())),
    ("spec/, ps/ and control/ never link gRPC",
     f"deps({shipped('//spec/... + //ps/... + //control/...')}) intersect @system//:grpc"),
    ("spec/, ps/ and control/ never reach model/",
     f"deps({shipped('//spec/... + //ps/... + //control/...')}) intersect //model/..."),
    ("control/ and spec/ never reach kernels/ or ps/",
     f"deps({shipped('//control/... + //spec/...')}) intersect (//kernels/... + //ps/...)"),
    ("kernels/ never reaches proto, gRPC, spec/, model/ or ps/",
     "deps(//kernels/...) intersect (//proto/... + //spec/... + //model/... + //ps/... + "
     "@system//:grpc + @system//:protobuf)"),
    ("model/ names no backend implementation (it goes through kernels:factory)",
     "kind(rule, deps(//model/..., 1)) intersect (//kernels/cpu/... + //kernels/cuda/... + @cuda//:cuda)"),
    ("common/ reaches nothing of ours outside common/",
     "deps(//common/...) intersect (//proto/... + //spec/... + //kernels/... + //model/... + "
     "//ps/... + //control/... + //rpc/... + //data/...)"),
    ("rpc/ adapts the interfaces, never the implementations",
     f"deps({shipped('//rpc/...')}) intersect (//ps:parameter_store + //control:coordinator_state"
     " + //control:scheduler + //control:job_store + " +
     " + ".join(f"//control:{c}" for c in COLLABORATORS) + " + //model/... + //kernels/...)"),
    ("the coordinator and downpourctl never link a compute backend",
     "deps(//coordinator:downpour-coordinator + //client:downpourctl) intersect "
     "(//kernels/... + //model/... + @cuda//:cuda)"),
    ("the shard links only the CPU optimizer of kernels/",
     "deps(//server:downpour-ps) intersect (//kernels/cuda/... + //kernels:factory + //model/... "
     "+ @cuda//:cuda)"),
    ("the worker daemon never links the parameter store or the coordinator's logic",
     "deps(//worker:downpour-worker) intersect (//ps:parameter_store + //control:coordinator_state"
     " + //control:scheduler + //control:job_store)"),
]

# (folder, forbidden #include prefixes) over the sources themselves, in
# quotes or angle brackets.
GRPC = ("grpcpp/", "grpc/", "grpc++/")
DEVICE_APIS = ("cuda", "cublas", "cudnn", "nccl", "cuda_runtime")
INCLUDE_RULES = [
    ("ps", GRPC + ("model/", "rpc/", "control/", "kernels/cuda/") + DEVICE_APIS),
    ("control", GRPC + ("model/", "rpc/", "ps/", "kernels/") + DEVICE_APIS),
    ("spec", GRPC + ("model/", "rpc/", "ps/", "control/", "kernels/") + DEVICE_APIS),
    ("kernels", GRPC + ("model/", "ps/", "spec/", "control/", "rpc/", "proto/")),
    # The model reaches the device only through kernels/backend.h and
    # kernels/factory.h.
    ("model", GRPC + ("kernels/cpu/", "kernels/cuda/", "ps/", "control/", "rpc/") + DEVICE_APIS),
]
MAX_LINES = 1000
SOURCE = re.compile(r".*\.(cc|h|cu|cuh)$")


def query(expression):
    result = subprocess.run(
        ["bazel", "query", "--noshow_progress", "--output=label", expression],
        cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        return None, result.stderr.strip().splitlines()[-1:] or ["bazel query failed"]
    return [line for line in result.stdout.split() if line], None


def sources(folder):
    for base, _, files in os.walk(os.path.join(ROOT, folder)):
        for name in files:
            if SOURCE.match(name):
                yield os.path.join(base, name)


def check_includes():
    bad = []
    for folder, forbidden in INCLUDE_RULES:
        for path in sources(folder):
            with open(path, errors="replace") as f:
                for number, line in enumerate(f, 1):
                    m = re.match(r'\s*#\s*include\s+["<]([^">]+)[">]', line)
                    if m and m.group(1).startswith(forbidden):
                        bad.append(f"{os.path.relpath(path, ROOT)}:{number}: {m.group(1)}")
    return bad


def check_file_sizes():
    bad = []
    for folder in os.listdir(ROOT):
        if folder.startswith((".", "bazel-")) or not os.path.isdir(os.path.join(ROOT, folder)):
            continue
        for path in sources(folder):
            with open(path, errors="replace") as f:
                lines = sum(1 for _ in f)
            if lines >= MAX_LINES:
                bad.append(f"{os.path.relpath(path, ROOT)}: {lines} lines")
    return bad


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--junit", help="write the results as JUnit XML here")
    args = parser.parse_args()
    results = []  # (name, failure lines or [])
    for name, expression in RULES:
        found, error = query(expression)
        if error:
            results.append((name, [f"query failed: {error[0]}"]))
        else:
            results.append((name, found))
    results.append(("ps/, control/, spec/ and kernels/ include nothing above them",
                    check_includes()))
    results.append((f"no source file reaches {MAX_LINES} lines", check_file_sizes()))
    failed = 0
    for name, problems in results:
        if problems:
            failed += 1
            print(f"layering: FAILED {name}:", file=sys.stderr)
            for p in problems[:20]:
                print(f"  {p}", file=sys.stderr)
    print(f"layering: {len(results) - failed} of {len(results)} rules hold")
    if args.junit:
        write_junit(args.junit, "layering",
                    [(name, "failed" if problems else "passed", "\n".join(problems))
                     for name, problems in results])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
