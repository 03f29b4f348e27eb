#!/usr/bin/env python3
"""The compare stage of bench/ctr_session.sh: Downpour's click job against
the PyTorch baseline (bench/pytorch_ctr.py) on the same data, as a small
Markdown table and one JSON line. Standard library only.

  python3 bench/ctr_compare.py --job job.json --progress train_progress.txt \\
      --worker_logs w0.log w1.log --pytorch pytorch.txt

Downpour's figures:
  examples/s       steady state: the median of the job's rates that
                   `downpourctl submit --wait` printed (the last line of each
                   step), leaving out those before the second report (the
                   first window holds the warm-up). A rate is the sum over
                   the workers of each one's last log_every_steps window,
                   its own evaluations left out (worker/trainer_loop.cc); in
                   SYNC the other rank's window still holds its wait for
                   rank 0's evaluation, which the median passes over.
  all steps        from each worker's closing log line ("rank R trained N
                   steps in T s"): N x batch_size / T summed over the ranks,
                   T being the rank's time in training steps (warm-up
                   included, its own evaluations not).
  AUC, log loss    the job's final ones (`downpourctl -o json get`).
  evaluations      each worker's "evaluated N test examples in S s" lines:
                   how many and their seconds in all.
PyTorch's: the final JSON line of bench/pytorch_ctr.py (examples_per_s,
examples_per_s_all_steps, auc, log_loss, eval_s) and its per-evaluation
lines. The ratio is Downpour / PyTorch of the steady-state rates (and of
the all-steps ones beside it).
"""
import argparse
import json
import re
import statistics
import sys

PROGRESS = re.compile(r'\bstep (\d+)/(\d+) loss \S+ ([\d.]+) ex/s')
TRAINED = re.compile(r'rank (\d+) trained (\d+) steps in ([\d.]+) s')
EVALUATED = re.compile(r'evaluated \d+ test examples in ([\d.]+) s')


def load_json(path, what):
    """The JSON object in `path` (the last one when it holds JSON lines)."""
    try:
        text = open(path).read()
    except OSError as e:
        sys.exit(f'ctr_compare.py: cannot read {what} {path}: {e.strerror}')
    try:
        return json.loads(text)
    except ValueError:
        pass
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith('{'):
            try:
                return json.loads(line)
            except ValueError:
                continue
    sys.exit(f'ctr_compare.py: {path} holds no JSON ({what})')


def downpour_figures(a):
    job = load_json(a.job, 'the job')
    spec = job.get('spec', {})
    batch = int(spec.get('dataset', {}).get('batch_size', 0) or 0)
    log_every = int(spec.get('log_every_steps', 0) or 0)
    last_rate = {}
    try:
        for line in open(a.progress):
            m = PROGRESS.search(line)
            if m:
                last_rate[int(m.group(1))] = float(m.group(3))
    except OSError:
        pass
    rates = [r for step, r in last_rate.items() if step > log_every and r > 0]
    all_steps = 0.0
    evaluations = []
    for path in a.worker_logs:
        try:
            text = open(path).read()
        except OSError:
            continue
        evaluations += [float(seconds) for seconds in EVALUATED.findall(text)]
        found = TRAINED.findall(text)
        if found and batch:
            _, steps, seconds = found[-1]
            if float(seconds) > 0:
                all_steps += int(steps) * batch / float(seconds)
    return {
        'system': 'downpour',
        'examples_per_s': round(statistics.median(rates), 1) if rates else None,
        'examples_per_s_all_steps': round(all_steps, 1) if all_steps else None,
        'auc': job.get('test_auc'), 'log_loss': job.get('test_log_loss'),
        'state': job.get('state'), 'steps': int(job.get('step', 0) or 0),
        'rate_windows': len(rates),
        'evaluations': len(evaluations), 'eval_s': round(sum(evaluations), 3),
    }


def pytorch_evaluations(path):
    """How many per-evaluation lines bench/pytorch_ctr.py printed."""
    count = 0
    try:
        for line in open(path):
            line = line.strip()
            if line.startswith('{') and '"eval"' in line:
                count += 1
    except OSError:
        pass
    return count


def fmt(value, digits):
    return '-' if value is None else f'{value:,.{digits}f}'


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--job', required=True, help='`downpourctl -o json get JOB` output')
    p.add_argument('--progress', required=True, help='`downpourctl submit --wait` stderr')
    p.add_argument('--worker_logs', nargs='*', default=[])
    p.add_argument('--pytorch', required=True, help='bench/pytorch_ctr.py output')
    a = p.parse_args()
    ours = downpour_figures(a)
    theirs = load_json(a.pytorch, 'the PyTorch run')
    rows = [('Downpour', ours), (f'PyTorch ({theirs.get("device", "?")}, '
                                 f'{theirs.get("precision", "?")})', theirs)]
    print('| system | examples/s (steady) | examples/s (all steps) | test AUC | test log loss |')
    print('|---|---|---|---|---|')
    for name, r in rows:
        print(f'| {name} | {fmt(r.get("examples_per_s"), 0)} | '
              f'{fmt(r.get("examples_per_s_all_steps"), 0)} | {fmt(r.get("auc"), 4)} | '
              f'{fmt(r.get("log_loss"), 4)} |')
    steady = ratio(ours['examples_per_s'], theirs.get('examples_per_s'))
    whole = ratio(ours['examples_per_s_all_steps'], theirs.get('examples_per_s_all_steps'))
    print(f'\nDownpour / PyTorch examples/s: {fmt(steady, 3)} steady, {fmt(whole, 3)} all steps; '
          f'Bayes AUC {fmt(theirs.get("bayes_auc"), 4)}, '
          f'log loss {fmt(theirs.get("bayes_log_loss"), 4)}')
    their_evaluations = pytorch_evaluations(a.pytorch)
    print(f'Evaluations of the test set: Downpour {ours["evaluations"]} in '
          f'{fmt(ours["eval_s"], 3)} s, PyTorch {their_evaluations} in '
          f'{fmt(theirs.get("eval_s"), 3)} s')
    print(json.dumps({'downpour': ours, 'pytorch': {k: theirs.get(k) for k in (
        'examples_per_s', 'examples_per_s_all_steps', 'auc', 'log_loss', 'device', 'precision',
        'steps', 'batch', 'eval_s')}, 'pytorch_evaluations': their_evaluations,
        'ratio_steady': steady, 'ratio_all_steps': whole}))


if __name__ == '__main__':
    main()
