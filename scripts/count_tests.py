"""Counts test cases from Bazel's test.xml files; prints 'N passed, N failed'.

A test target that produced no test.xml (it failed to build or crashed
before writing one) counts as one failure. Exits non-zero on any failure.
"""
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

root = sys.argv[1]
targets = subprocess.run(
    ["bazel", "query", "tests(//...)"], cwd=root, capture_output=True, text=True, check=True
).stdout.split()
passed = failed = skipped = 0
for target in targets:
    package, name = target[2:].split(":")
    xml = os.path.join(root, "bazel-testlogs", package, name, "test.xml")
    try:
        tree = ET.parse(xml)
    except (OSError, ET.ParseError):
        print(f"{target}: no test results (build failure or crash)", file=sys.stderr)
        failed += 1
        continue
    for case in tree.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            print(f"{target}: {case.get('classname')}.{case.get('name')} FAILED", file=sys.stderr)
        elif case.get("result") == "skipped" or case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
