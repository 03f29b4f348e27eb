#!/usr/bin/env python3
"""Helpers of bench/scaling.sh and bench/multihost.sh (standard library only):

  spec      write one run's job spec from an example spec
  nodes     whether a cluster is up (`downpourctl -o json nodes` on stdin);
            prints the workers' metrics addresses, w0 first
  sample    poll the workers' Prometheus metrics until SIGTERM (JSON lines)
  result    one run's JSON line from the job's final status and the samples
  ceiling   the transport ceiling: //bench:transport if given, else raw loopback TCP
  summary   a markdown table of scaling.jsonl with the ratios

See bench/scaling.sh for what is measured and how.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

# ------------------------------------------------------------------ spec

CONSISTENCY_KEYS = {'staleness', 'backup_workers', 'push_every', 'fetch_every'}


def extra_items(extra):
    """EXTRA_SPEC ("key: value; key: value", or one a line) as (key, line)."""
    items = []
    for part in re.split(r'[;\n]', extra or ''):
        part = part.strip()
        if not part:
            continue
        m = re.match(r'(\w+)\s*[:{]', part)
        if not m:
            sys.exit(f'scaling_tools: EXTRA_SPEC item {part!r} is not "field: value"')
        items.append((m.group(1), part))
    return items


def strip_top_level(text, keys):
    """The spec's text without its top-level fields named in keys (a field
    written on one line, or a block over several)."""
    out, depth, skipping = [], 0, False
    for line in text.splitlines():
        code = line.split('#', 1)[0]
        m = re.match(r'\s*(\w+)\s*[:{]', code)
        if depth == 0 and m and m.group(1) in keys:
            skipping = True
        if not skipping:
            out.append(line)
        depth += code.count('{') - code.count('}')
        if skipping and depth == 0:
            skipping = False
    return '\n'.join(out) + '\n'


def cmd_spec(a):
    text = open(a.base).read()
    extra = extra_items(a.extra)
    top_extra = [(k, line) for k, line in extra if k not in CONSISTENCY_KEYS]
    consistency_extra = ' '.join(line for k, line in extra if k in CONSISTENCY_KEYS)
    ours = {'name', 'num_workers', 'num_shards', 'steps', 'eval_every_steps', 'stop_at_accuracy',
            'precision', 'consistency', 'checkpoint'}
    text = strip_top_level(text, ours | {k for k, _ in top_extra})
    text, n = re.subn(r'\bbatch_size\s*:\s*\d+', f'batch_size: {a.batch}', text)
    if n != 1:
        sys.exit(f'scaling_tools: {a.base} has {n} batch_size fields, expected 1')
    lines = [
        f'# Written by bench/scaling.sh from {os.path.basename(a.base)}.',
        f'name: "{a.name}"',
        f'num_workers: {a.workers}',
        f'num_shards: {a.shards}',
        f'consistency {{ mode: {a.mode.upper()}{" " + consistency_extra if consistency_extra else ""} }}',
        f'precision: {a.precision.upper()}',
        f'steps: {a.steps}',
        f'eval_every_steps: {a.eval_every}',
        f'stop_at_accuracy: {a.target}',
    ] + [line for _, line in top_extra]
    with open(a.out, 'w') as f:
        f.write(text + '\n'.join(lines) + '\n')


# ----------------------------------------------------------------- nodes

def cmd_nodes(a):
    try:
        nodes = json.load(sys.stdin)
    except ValueError:
        sys.exit(1)
    alive = [n for n in nodes if n.get('alive')]
    shards = [n for n in alive if n.get('role') == 'SHARD']
    workers = {n['id']: n for n in alive if n.get('role') == 'WORKER'}
    wanted = [f'w{i}' for i in range(a.workers)]
    if len(shards) < a.shards or any(w not in workers for w in wanted):
        sys.exit(1)
    print(' '.join(workers[w].get('metrics_address', '') for w in wanted))


# ---------------------------------------------------------------- sample

# The step-time histograms' _sum series: the seconds the counters of the
# same names without _sum (before the histograms) counted.
METRICS = {
    'downpour_worker_steps_total': 'steps',
    'downpour_worker_step_seconds_sum': 'step_s',
    'downpour_worker_input_wait_seconds_sum': 'input_s',
    'downpour_worker_compute_seconds_sum': 'compute_s',
    'downpour_worker_exchange_seconds_sum': 'exchange_s',
}
METRIC_LINE = re.compile(r'^(downpour_worker_\w+)(\{[^}]*\})?\s+(\S+)')


def scrape(address):
    text = urllib.request.urlopen(f'http://{address}/metrics', timeout=1).read().decode()
    values = {}
    for line in text.splitlines():
        m = METRIC_LINE.match(line)
        if m and m.group(1) in METRICS:
            key = METRICS[m.group(1)]
            values[key] = values.get(key, 0.0) + float(m.group(3))
    return values


def cmd_sample(a):
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with open(a.out, 'a') as out:
        sweep = 0
        while not stop.is_set():
            began = time.time()
            for i, address in enumerate(a.addresses):
                try:
                    values = scrape(address)
                except (OSError, ValueError):
                    continue
                if 'steps' in values:  # The job's series exist while it trains.
                    out.write(json.dumps({'k': sweep, 'w': i, 't': time.time(), **values}) + '\n')
            out.flush()
            sweep += 1
            stop.wait(max(0.0, a.interval - (time.time() - began)))


# ---------------------------------------------------------------- result

def load_job(path):
    text = open(path).read().strip()
    start = text.find('{')
    if start < 0:
        return None
    try:
        return json.loads(text[start:])
    except ValueError:
        return None


def steady_windows(samples, rank0, eval_every, total_steps, warm_steps=50):
    """Pairs of sweeps (first, last) bounding training without evaluation
    or warm-up: per epoch after the first, the sweeps whose rank-0 step lies
    strictly between two evaluations (rank 0 evaluates once its step reaches
    a multiple of eval_every, so none ran between them); with only one epoch,
    the sweeps after its first warm_steps steps."""
    by_sweep = {}
    for s in samples:
        by_sweep.setdefault(s['k'], {})[s['w']] = s
    multi = eval_every > 0 and total_steps > eval_every
    groups = {}
    for k in sorted(by_sweep):
        s0 = by_sweep[k].get(rank0)
        if s0 is None:
            continue
        step = int(s0['steps'])
        if step >= total_steps:
            continue
        if multi:
            if step % eval_every == 0 or step // eval_every < 1:
                continue
            epoch = step // eval_every
        else:
            if step <= min(warm_steps, total_steps // 2):
                continue
            epoch = 0
        groups.setdefault(epoch, []).append(k)
    return [(by_sweep[ks[0]], by_sweep[ks[-1]]) for ks in groups.values() if len(ks) >= 2]


def cmd_result(a):
    job = load_job(a.job) or {}
    spec = job.get('spec', {})
    samples = []
    if os.path.exists(a.samples):
        for line in open(a.samples):
            try:
                samples.append(json.loads(line))
            except ValueError:
                pass
    batch = int(spec.get('dataset', {}).get('batch_size', a.batch))
    eval_every = int(spec.get('eval_every_steps', 0))
    total_steps = int(spec.get('steps', 0))
    target = float(spec.get('stop_at_accuracy', a.target))
    nodes = job.get('placement', {}).get('worker_nodes', [])
    rank0 = int(nodes[0][1:]) if nodes and re.fullmatch(r'w\d+', nodes[0]) else 0

    # Bytes a worker step moves: gradients pushed (wire dtype, every
    # push_every steps), parameters pulled as fp32 (every fetch_every).
    elements = sum(int(p.get('num_elements', 0))
                   for p in job.get('placement', {}).get('partitions', []))
    consistency = spec.get('consistency', {})
    push_every = max(1, int(consistency.get('push_every', 1) or 1))
    fetch_every = max(1, int(consistency.get('fetch_every', 1) or 1))
    wire = 2 if spec.get('gradient_wire_dtype') in ('BFLOAT16', 'FLOAT16') else 4
    step_bytes = elements * (wire / push_every + 4 / fetch_every)

    windows = steady_windows(samples, rank0, eval_every, total_steps)
    per = {}  # worker: [steps, seconds, step_s, input_s, compute_s, exchange_s]
    window_s = 0.0
    for first, last in windows:
        if rank0 in first and rank0 in last:
            window_s += last[rank0]['t'] - first[rank0]['t']
        for w, s in last.items():
            f = first.get(w)
            if f is None:
                continue
            acc = per.setdefault(w, [0.0] * 6)
            acc[0] += s['steps'] - f['steps']
            acc[1] += s['t'] - f['t']
            for j, key in enumerate(['step_s', 'input_s', 'compute_s', 'exchange_s'], start=2):
                acc[j] += s.get(key, 0.0) - f.get(key, 0.0)
    method = 'steady windows'
    if not per or all(v[0] <= 0 for v in per.values()):
        # Too short for a window: each worker's totals at its last sample,
        # the rate over its time in training steps.
        method = 'whole run (no steady window)'
        last = {}
        for s in samples:
            last[s['w']] = s
        per = {w: [s['steps'], s.get('step_s', 0.0), s.get('step_s', 0.0), s.get('input_s', 0.0),
                   s.get('compute_s', 0.0), s.get('exchange_s', 0.0)] for w, s in last.items()}
    rate = sum(v[0] * batch / v[1] for v in per.values() if v[1] > 0)
    step_s = sum(v[2] for v in per.values())

    def frac(j):
        return round(sum(v[j] for v in per.values()) / step_s, 4) if step_s > 0 else None

    exchange = sum(v[0] * step_bytes / v[5] for v in per.values() if v[5] > 0) / 1e9

    evaluations = job.get('evaluations', [])
    reached = next((e for e in evaluations if float(e.get('accuracy', 0)) >= target), None)
    ttt = None
    if reached is not None:
        # Time since submission plus the gap from the shell's clock start to
        # the submission: the evaluation's time less the shell's timestamp
        # (one host, one clock).
        ttt = round(int(reached['time_ms']) / 1000.0 - a.t_submit, 3)
    accuracy = float(evaluations[-1]['accuracy']) if evaluations else None
    start_ms = int(job.get('start_time_ms', 0) or 0)
    row = {
        'system': 'downpour', 'shape': a.shape, 'model': a.model, 'workers': a.workers,
        'gpus': a.gpus, 'shards': a.shards, 'mode': a.mode, 'precision': a.precision,
        'extra': a.extra, 'examples_per_s': round(rate, 1), 'time_to_target_s': ttt,
        'test_accuracy': accuracy, 'input_wait_frac': frac(3), 'compute_frac': frac(4),
        'exchange_frac': frac(5), 'exchange_gb_s': round(exchange, 3),
        'state': job.get('state', 'UNKNOWN'), 'target': target, 'steps': int(job.get('step', 0)),
        'evaluations': len(evaluations), 'batch_per_worker': batch,
        'startup_s': round(start_ms / 1000.0 - a.t_submit, 3) if start_ms else None,
        'wall_s': round(a.t_end - a.t_submit, 3), 'rate_method': method,
        'window_s': round(window_s, 3), 'param_mb': round(elements * 4 / 2**20, 2),
        'exchange_mb_per_step': round(step_bytes / 2**20, 2), 'samples': len(samples),
    }
    if job.get('state') != 'SUCCEEDED' or a.note:
        row['message'] = ' '.join(x for x in [a.note, job.get('message', '')] if x)
    print(json.dumps(row))


# --------------------------------------------------------------- ceiling

def raw_tcp_gbps(megabytes=512, chunk=4 << 20):
    """Loopback TCP goodput, one connection, one direction, GB/s (1e9)."""
    server = socket.socket()
    server.bind(('127.0.0.1', 0))
    server.listen(1)
    total = megabytes << 20
    received = [0]

    def sink():
        conn, _ = server.accept()
        buf = bytearray(chunk)
        view = memoryview(buf)
        while received[0] < total:
            n = conn.recv_into(view)
            if n == 0:
                break
            received[0] += n
        conn.sendall(b'k')
        conn.close()

    t = threading.Thread(target=sink)
    t.start()
    client = socket.create_connection(server.getsockname())
    data = memoryview(bytearray(chunk))
    began = time.perf_counter()
    sent = 0
    while sent < total:
        client.sendall(data)
        sent += chunk
    client.recv(1)
    seconds = time.perf_counter() - began
    client.close()
    t.join()
    server.close()
    return total / seconds / 1e9


def cmd_ceiling(a):
    row = {'model': a.model, 'size_mb': a.size_mb, 'workers': a.workers, 'shards': a.shards}
    if a.transport:
        try:
            out = subprocess.run([a.transport, f'--size_mb={a.size_mb}', f'--workers={a.workers}',
                                  f'--shards={a.shards}', '--naive=false'],
                                 capture_output=True, text=True, timeout=a.timeout)
            line = next((l for l in out.stdout.splitlines() if l.startswith('{')), None)
            if line:
                r = json.loads(line)
                row.update({'source': '//bench:transport', 'raw_tcp_gb_s': r['raw_tcp_gbps'],
                            'downpour_push_pull_gb_s': r['downpour_gbps'],
                            'rtt_p50_us': r['rtt_p50_us'], 'steps': r['steps']})
                print(json.dumps({'ceiling': row}))
                return
            row['transport_error'] = (out.stderr.strip().splitlines() or ['no output'])[-1][:300]
        except (OSError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
            row['transport_error'] = str(e)[:300]
    row.update({'source': 'python loopback TCP, one connection', 'raw_tcp_gb_s':
                round(raw_tcp_gbps(), 3)})
    print(json.dumps({'ceiling': row}))


# --------------------------------------------------------------- summary

def fmt(v, digits=1):
    if v is None:
        return '—'
    if isinstance(v, float):
        return f'{v:.{digits}f}'
    return str(v)


def cmd_summary(a):
    rows, ceilings, failed = [], [], []
    for line in open(a.jsonl):
        line = line.strip()
        if not line.startswith('{'):
            continue
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if 'ceiling' in r:
            ceilings.append(r['ceiling'])
        elif 'error' in r:
            failed.append(r)
        elif 'system' in r:
            rows.append(r)
    for c in ceilings:
        print(f"ceiling ({c.get('model')}, {c.get('size_mb')} MiB, {c.get('source')}): raw TCP "
              f"{fmt(c.get('raw_tcp_gb_s'), 2)} GB/s, Downpour push+pull "
              f"{fmt(c.get('downpour_push_pull_gb_s'), 2)} GB/s")
    print()
    print('| system | model | precision | shape | GPUs | mode | extra | examples/s | time to target s '
          '| accuracy | input wait | compute | exchange | exchange GB/s |')
    print('| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |')
    for r in rows:
        print(f"| {r['system']} | {r['model']} | {r['precision']} | {r['shape']} | {r['gpus']} | "
              f"{r['mode']} | {r.get('extra') or ''} | {fmt(r.get('examples_per_s'), 0)} | "
              f"{fmt(r.get('time_to_target_s'))} | {fmt(r.get('test_accuracy'), 4)} | "
              f"{fmt(r.get('input_wait_frac'), 3)} | {fmt(r.get('compute_frac'), 3)} | "
              f"{fmt(r.get('exchange_frac'), 3)} | {fmt(r.get('exchange_gb_s'), 2)} |")

    def key(r):
        return (r['model'], r['precision'])

    ratios = []
    for r in rows:
        if r['system'] != 'downpour':
            continue
        same = [p for p in rows if p['system'].startswith('pytorch') and key(p) == key(r)]
        label = f"{r['model']} {r['precision']} {r['shape']} {r['mode']}" + (
            f" [{r['extra']}]" if r.get('extra') else '')
        single = next((p for p in same if p['mode'] == 'single'), None)
        if r['gpus'] <= 1 and r['workers'] == 1 and single and single.get('examples_per_s'):
            ratios.append(f"{label}: examples/s ours / PyTorch 1 GPU = "
                          f"{r['examples_per_s'] / single['examples_per_s']:.2f}")
        ddp = next((p for p in same if p['mode'] == 'DDP' and p['gpus'] == r['gpus']), None)
        if ddp is None and r['gpus'] == 1:
            ddp = single
        if ddp:
            a_t, b_t = r.get('time_to_target_s'), ddp.get('time_to_target_s')
            ratio = f'{a_t / b_t:.2f}' if a_t and b_t else 'n/a (not reached)'
            ratios.append(f"{label}: time to target ours {fmt(a_t)} s vs {ddp['shape']} "
                          f"{fmt(b_t)} s, ours / theirs = {ratio}")
    # 4-GPU efficiency: 4-GPU examples/s / (4 x the same system's 1-GPU).
    for r in rows:
        if r['gpus'] != 4:
            continue
        if r['system'] == 'downpour':
            base = next((b for b in rows if b['system'] == 'downpour' and key(b) == key(r) and
                         b['gpus'] == 1 and b['mode'] == r['mode'] and
                         b.get('extra') == r.get('extra')), None)
        else:
            base = next((b for b in rows if b['system'] == 'pytorch' and key(b) == key(r)), None)
        if base and base.get('examples_per_s'):
            eff = r['examples_per_s'] / (4 * base['examples_per_s'])
            ratios.append(f"{r['system']} {r['model']} {r['precision']} {r['shape']} {r['mode']}: "
                          f"4-GPU efficiency {eff:.2f} (vs {base['shape']})")
    if ratios:
        print()
        for line in ratios:
            print('- ' + line)
    for r in failed:
        print(f"- failed: {r.get('system')} {r.get('model')} {r.get('precision')} on "
              f"{r.get('gpus')} GPU(s): {r['error']}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest='command', required=True)
    s = sub.add_parser('spec')
    for flag in ['base', 'out', 'name', 'mode', 'precision']:
        s.add_argument('--' + flag, required=True)
    for flag in ['workers', 'shards', 'batch', 'steps', 'eval_every']:
        s.add_argument('--' + flag, type=int, required=True)
    s.add_argument('--target', type=float, required=True)
    s.add_argument('--extra', default='')
    s.set_defaults(run=cmd_spec)
    s = sub.add_parser('nodes')
    s.add_argument('--workers', type=int, required=True)
    s.add_argument('--shards', type=int, required=True)
    s.set_defaults(run=cmd_nodes)
    s = sub.add_parser('sample')
    s.add_argument('--out', required=True)
    s.add_argument('--interval', type=float, default=0.2)
    s.add_argument('addresses', nargs='+')
    s.set_defaults(run=cmd_sample)
    s = sub.add_parser('result')
    for flag in ['job', 'samples', 'shape', 'model', 'mode', 'precision']:
        s.add_argument('--' + flag, required=True)
    for flag in ['workers', 'gpus', 'shards', 'batch']:
        s.add_argument('--' + flag, type=int, required=True)
    for flag in ['t_submit', 't_end', 'target']:
        s.add_argument('--' + flag, type=float, required=True)
    s.add_argument('--extra', default='')
    s.add_argument('--note', default='')
    s.set_defaults(run=cmd_result)
    s = sub.add_parser('ceiling')
    s.add_argument('--transport', default='')
    s.add_argument('--model', default='')
    s.add_argument('--size_mb', type=float, required=True)
    s.add_argument('--workers', type=int, default=1)
    s.add_argument('--shards', type=int, default=1)
    s.add_argument('--timeout', type=float, default=120)
    s.set_defaults(run=cmd_ceiling)
    s = sub.add_parser('summary')
    s.add_argument('jsonl')
    s.set_defaults(run=cmd_summary)
    a = p.parse_args()
    a.run(a)


if __name__ == '__main__':
    main()
