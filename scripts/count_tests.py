"""Counts test cases from Bazel's test.xml files; prints 'N passed, N failed'.

A test target Bazel reports as not run (failed to build, no status, timeout)
or that left no test.xml counts as one failure, so a stale result from an
earlier run never hides a broken build. The cases of every EXTRA_XML (JUnit
files of checks run outside Bazel, such as tests/layering_test.py) count too;
a missing one counts as a failure. Exits non-zero on any failure.
usage: count_tests.py REPO_ROOT BAZEL_OUTPUT_LOG [EXTRA_XML...]
"""
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

root, log_path, extra_xml = sys.argv[1], sys.argv[2], sys.argv[3:]
targets = subprocess.run(
    ["bazel", "query", "tests(//...)"], cwd=root, capture_output=True, text=True
).stdout.split()
summary = {}
with open(log_path, errors="replace") as log:
    for line in log:
        m = re.match(r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED TO BUILD|FAILED|NO STATUS|TIMEOUT|SKIPPED|FLAKY)", line)
        if m:
            summary[m.group(1)] = m.group(2)

passed = failed = skipped = 0


def count_cases(tree, label):
    global passed, failed, skipped
    for case in tree.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            print(f"{label}: {case.get('classname')}.{case.get('name')} FAILED", file=sys.stderr)
        elif case.get("result") == "skipped" or case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1


def result_files(folder):
    """The test.xml files of a target's newest run: one per shard of a
    sharded test (shard_I_of_N/; of the newest N, all N of them), else the
    target's own."""
    shards = {}
    for entry in os.listdir(folder) if os.path.isdir(folder) else []:
        m = re.fullmatch(r"shard_(\d+)_of_(\d+)", entry)
        if m:
            path = os.path.join(folder, entry)
            shards.setdefault(int(m.group(2)), []).append(path)
    if not shards:
        return [os.path.join(folder, "test.xml")]
    newest = max(shards, key=lambda n: max(os.path.getmtime(p) for p in shards[n]))
    if len(shards[newest]) != newest:
        raise OSError(f"{len(shards[newest])} of {newest} shards ran")
    return [os.path.join(p, "test.xml") for p in sorted(shards[newest])]


for path in extra_xml:
    try:
        count_cases(ET.parse(path), path)
    except (OSError, ET.ParseError):
        print(f"{path}: no results", file=sys.stderr)
        failed += 1
if not targets:
    print("no test targets found (bazel query failed?)", file=sys.stderr)
    failed += 1
for target in targets:
    status = summary.get(target)
    if status == "SKIPPED":  # incompatible here: a CUDA-only test in a build without CUDA
        print(f"{target}: skipped (incompatible with this build)", file=sys.stderr)
        skipped += 1
        continue
    if status in ("FAILED TO BUILD", "NO STATUS", "TIMEOUT") or status is None:
        print(f"{target}: {status or 'not run'}", file=sys.stderr)
        failed += 1
        continue
    package, name = target[2:].split(":")
    try:
        trees = [ET.parse(xml) for xml in result_files(os.path.join(root, "bazel-testlogs",
                                                                     package, name))]
    except (OSError, ET.ParseError):
        print(f"{target}: no test results", file=sys.stderr)
        failed += 1
        continue
    if not any(True for tree in trees for _ in tree.iter("testcase")):
        # A test binary that is not gtest: judged by Bazel's verdict.
        if status == "PASSED":
            passed += 1
        else:
            failed += 1
        continue
    for tree in trees:
        count_cases(tree, target)
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
