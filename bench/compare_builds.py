#!/usr/bin/env python3
"""Compares two builds' benchmark lines, run alternately on one machine:
//bench:step_time (per model and precision: median ms/step of each build,
new / old) and //bench:transport (per configuration: median GB/s and RTT p50
of each build, new / old). Lines are JSON objects; each file may hold several
runs of the same build.
usage: compare_builds.py OLD.jsonl NEW.jsonl"""
import json
import statistics
import sys


def load(path):
    rows = []
    for line in open(path):
        line = line.strip()
        if line.startswith('{'):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows


def group(rows, key, value):
    out = {}
    for r in rows:
        k = key(r)
        if k is not None and value in r:
            out.setdefault(k, []).append(r[value])
    return out


def table(title, columns, old, new, fmt):
    if not set(old) & set(new):
        return
    print(f'\n{title}\n')
    print('| ' + ' | '.join(columns) + ' | old (median of n) | new (median of n) | new / old |')
    print('|' + ' --- |' * (len(columns) + 3))
    for k in sorted(old, key=str):
        if k not in new:
            continue
        o, n = statistics.median(old[k]), statistics.median(new[k])
        print('| ' + ' | '.join(str(x) for x in k) +
              f' | {fmt(o)} ({len(old[k])}) | {fmt(n)} ({len(new[k])}) | {n / o:.3f} |')


old, new = load(sys.argv[1]), load(sys.argv[2])
step = lambda r: (r['model'], r['batch'], r['precision']) if 'step_ms_loop' in r else None
table('Step time (ms/step, lower is better)', ['model', 'batch', 'precision'],
      group(old, step, 'step_ms_loop'), group(new, step, 'step_ms_loop'), lambda x: f'{x:.3f}')


def config(r):
    if 'size_bytes' not in r:
        return None
    return (round(r['size_bytes'] / 2**20), r['workers'], r['shards'])


table('Transport goodput (GB/s, higher is better)', ['MiB', 'workers', 'shards'],
      group(old, config, 'downpour_gbps'), group(new, config, 'downpour_gbps'),
      lambda x: f'{x:.2f}')
table('Transport round trip p50 (us, lower is better)', ['MiB', 'workers', 'shards'],
      group(old, config, 'rtt_p50_us'), group(new, config, 'rtt_p50_us'), lambda x: f'{x:.0f}')
