#!/usr/bin/env python3
"""Joins //bench:step_time's and bench/pytorch_step_time.py's JSON lines into
the table of BENCHMARKS.md: per model and precision, our step time, PyTorch's
best layout (NCHW or channels_last), the ratio ours / PyTorch, and memory.
Rows pair by precision name (fp32, tf32, fp32_strict, bf16, fp16: the same
meaning on both sides, proto/job.proto's Precision); the last lines give
each precision's worst ratio.
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
header = next((r for r in load(sys.argv[2]) if 'device' in r), {})
print(f"card: {header.get('device', '?')}; torch {header.get('torch', '?')}, "
      f"cuDNN {header.get('cudnn', '?')}; PyTorch's defaults: "
      f"cudnn.allow_tf32={header.get('default_cudnn_allow_tf32', '?')}, "
      f"matmul.allow_tf32={header.get('default_matmul_allow_tf32', '?')}\n")
print('| model | batch | precision | ours ms/step | PyTorch eager ms/step (layout) | ours / PyTorch '
      '| ours MiB (compute) | PyTorch peak MiB |')
print('| --- | --- | --- | --- | --- | --- | --- | --- |')
worst = {}
for o in ours:
    cands = [t for t in theirs if t['model'] == o['model'] and t['precision'] == o['precision']]
    if not cands:
        continue
    best = min(cands, key=lambda t: t['step_ms_loop'])
    ratio = o['step_ms_loop'] / best['step_ms_loop']
    if ratio > worst.get(o['precision'], (0, ''))[0]:
        worst[o['precision']] = (ratio, o['model'])
    print(f"| {o['model']} | {o['batch']} | {o['precision']} | {o['step_ms_loop']:.3f} | "
          f"{best['step_ms_loop']:.3f} ({best['format']}) | {ratio:.2f} | "
          f"{o['mem_mb']:.0f} ({o['compute_mb']:.0f}) | "
          f"{best['peak_mem_mb']:.0f} |")
print()
for precision, (ratio, model) in worst.items():
    print(f"worst ratio in {precision}: {ratio:.2f} ({model})")
