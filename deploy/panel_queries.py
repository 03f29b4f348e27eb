#!/usr/bin/env python3
"""Lists the PromQL of every Grafana panel and console query, ready to evaluate.

Reads deploy/grafana/downpour.json (each panel's targets) and
deploy/prometheus/consoles/*.html (each backquoted expression after a
"panel:" comment), turns what only Grafana or the console fills in into
PromQL an instant query takes, and marks the ones deploy/panels_no_data.yml
allows to come back empty, with the reason. A test evaluates each `expr`
against a live Prometheus scraping a cluster: every one returns data unless
`may_be_empty` says why it need not.

Substitutions: $job / ${job} (the Job variable, all jobs) -> .+ ;
$__rate_interval / $__interval -> 1m ; $__range -> 5m ; in a console's printf'd
query, label="%s" (one job, shard or instance of the row) -> label=~".+".

usage: deploy/panel_queries.py [--format json|tsv] [--check]
  --check: exit 1 (saying why) if an allowlist entry names no panel, a panel
           has no expression, or a placeholder is left unsubstituted.
Standard library only, plus PyYAML (Debian's python3-yaml) for the allowlist.
"""
import argparse
import glob
import json
import os
import re
import sys

DEPLOY = os.path.dirname(os.path.abspath(__file__))
DASHBOARD = os.path.join(DEPLOY, "grafana", "downpour.json")
CONSOLES = os.path.join(DEPLOY, "prometheus", "consoles")
ALLOWLIST = os.path.join(DEPLOY, "panels_no_data.yml")

GRAFANA_VARIABLES = [
    (re.compile(r"\$\{job(?::[a-z]+)?\}|\$job\b"), ".+"),
    (re.compile(r"\$__rate_interval\b|\$\{__rate_interval\}"), "1m"),
    (re.compile(r"\$__interval\b|\$\{__interval\}"), "1m"),
    (re.compile(r"\$__range\b|\$\{__range\}"), "5m"),
]
PRINTF_LABEL = re.compile(r'(\w+)\s*=\s*"%s"')
PANEL_COMMENT = re.compile(r"\{\{-?\s*/\*\s*panel:\s*(.*?)\s*\*/\s*-?\}\}")
BACKQUOTED = re.compile(r"`([^`]*)`")


def grafana_queries(path=DASHBOARD):
    with open(path) as f:
        dashboard = json.load(f)

    def walk(panels):
        for panel in panels:
            if panel.get("type") == "row":
                yield from walk(panel.get("panels", []))
                continue
            for target in panel.get("targets", []):
                raw = target.get("expr", "")
                expr = raw
                for pattern, value in GRAFANA_VARIABLES:
                    expr = pattern.sub(value, expr)
                yield {
                    "source": "grafana",
                    "file": os.path.relpath(path, DEPLOY),
                    "panel": panel.get("title", ""),
                    "ref": target.get("refId", ""),
                    "raw": raw,
                    "expr": expr,
                }

    yield from walk(dashboard.get("panels", []))


def console_queries(directory=CONSOLES):
    for path in sorted(glob.glob(os.path.join(directory, "*.html"))):
        with open(path) as f:
            text = f.read()
        # Each backquoted string belongs to the closest "panel:" comment
        # before it; the header comment (before the first one) holds none.
        marks = list(PANEL_COMMENT.finditer(text))
        for i, mark in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
            segment = text[mark.end():end]
            for n, found in enumerate(BACKQUOTED.finditer(segment)):
                raw = found.group(1)
                yield {
                    "source": "console",
                    "file": os.path.relpath(path, DEPLOY),
                    "panel": mark.group(1),
                    "ref": str(n),
                    "raw": raw,
                    "expr": PRINTF_LABEL.sub(r'\1=~".+"', raw),
                }


def load_allowlist(path=ALLOWLIST):
    import yaml  # Debian's python3-yaml

    with open(path) as f:
        entries = yaml.safe_load(f) or []
    for entry in entries:
        for key in ("source", "panel", "reason"):
            if not entry.get(key):
                raise ValueError(f"{path}: entry {entry} has no {key}")
    return entries


def matches(entry, query):
    return (entry["source"] == query["source"] and entry["panel"] == query["panel"]
            and str(entry.get("ref", query["ref"])) == query["ref"])


def all_queries():
    queries = list(grafana_queries()) + list(console_queries())
    allowlist = load_allowlist()
    for query in queries:
        reasons = [e["reason"].strip() for e in allowlist if matches(e, query)]
        query["may_be_empty"] = reasons[0] if reasons else None
    return queries, allowlist


def problems(queries, allowlist):
    found = []
    for entry in allowlist:
        if not any(matches(entry, q) for q in queries):
            found.append(f"allowlist entry names no query: {entry['source']} / {entry['panel']}"
                         f"{' / ' + str(entry['ref']) if 'ref' in entry else ''}")
    for q in queries:
        where = f"{q['file']}: {q['panel']} ({q['ref']})"
        if not q["expr"].strip():
            found.append(f"{where}: empty expression")
        if re.search(r"\$\w|%s", q["expr"]):
            found.append(f"{where}: placeholder left in {q['expr']!r}")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=["json", "tsv"], default="json")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    queries, allowlist = all_queries()
    if args.check:
        found = problems(queries, allowlist)
        for p in found:
            print(p, file=sys.stderr)
        if found:
            return 1
    if args.format == "json":
        json.dump(queries, sys.stdout, indent=1)
        print()
    else:
        for q in queries:
            print("\t".join([q["source"], q["panel"], q["ref"], q["expr"],
                             q["may_be_empty"] or ""]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
