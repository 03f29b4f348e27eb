"""JUnit XML for the checks scripts/test.sh runs outside Bazel (read back by
scripts/count_tests.py): one suite, one test case per check."""

import sys
import xml.etree.ElementTree as ET


def write_junit(path, suite, cases):
    """Writes `cases` (name, status, message) to `path` as suite `suite`;
    status is "passed", "failed" or "skipped", message the failure or the
    reason for the skip (its first line becomes the attribute)."""
    root = ET.Element("testsuites")
    node = ET.SubElement(root, "testsuite", name=suite, tests=str(len(cases)),
                         failures=str(sum(1 for c in cases if c[1] == "failed")),
                         skipped=str(sum(1 for c in cases if c[1] == "skipped")))
    for name, status, message in cases:
        case = ET.SubElement(node, "testcase", classname=suite, name=name)
        if status == "failed":
            first = message.splitlines()[0] if message else ""
            ET.SubElement(case, "failure", message=first).text = message
        elif status == "skipped":
            ET.SubElement(case, "skipped", message=message or "")
    ET.ElementTree(root).write(path)


def report(prefix, cases, junit=None, tag_lines=False):
    """Prints each case (name, status, message) as "STATUS  name" (after
    "PREFIX: " with tag_lines) with its message indented (failures on
    stderr), then "PREFIX: N passed, N failed, N skipped"; writes them to
    `junit` when given. Returns the number failed."""
    for name, status, message in cases:
        print((f"{prefix}: " if tag_lines else "") + f"{status.upper():7} {name}" + (f"\n  {message}".replace("\n", "\n  ") if message else ""),
              file=sys.stderr if status == "failed" else sys.stdout)
    failed = sum(1 for c in cases if c[1] == "failed")
    skipped = sum(1 for c in cases if c[1] == "skipped")
    print(f"{prefix}: {len(cases) - failed - skipped} passed, {failed} failed, {skipped} skipped")
    if junit:
        write_junit(junit, prefix, cases)
    return failed
