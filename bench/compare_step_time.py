#!/usr/bin/env python3
"""Joins //bench:step_time's and bench/pytorch_step_time.py's JSON lines into
the table of BENCHMARKS.md: per model and precision, our step time, PyTorch's
best layout (NCHW or channels_last), the ratio ours / PyTorch, and memory.
Usage: compare_step_time.py OURS.jsonl PYTORCH.jsonl"""
import json
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


ours = [r for r in load(sys.argv[1]) if 'model' in r]
theirs = [r for r in load(sys.argv[2]) if 'model' in r]
device = next((r['device'] for r in load(sys.argv[2]) if 'device' in r), '?')
print(f'card: {device}\n')
print('| model | batch | precision | ours ms/step | PyTorch eager ms/step (layout) | ours / PyTorch '
      '| ours MiB (compute) | PyTorch peak MiB |')
print('| --- | --- | --- | --- | --- | --- | --- | --- |')
for o in ours:
    cands = [t for t in theirs if t['model'] == o['model'] and t['precision'] == o['precision']]
    if not cands:
        continue
    best = min(cands, key=lambda t: t['step_ms_loop'])
    ratio = o['step_ms_loop'] / best['step_ms_loop']
    print(f"| {o['model']} | {o['batch']} | {o['precision']} | {o['step_ms_loop']:.3f} | "
          f"{best['step_ms_loop']:.3f} ({best['format']}) | {ratio:.2f} | "
          f"{o['mem_mb']:.0f} ({o['compute_mb']:.0f}) | "
          f"{best['peak_mem_mb']:.0f} |")
