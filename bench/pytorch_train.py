#!/usr/bin/env python3
"""PyTorch baselines of the scaling benchmark (bench/scaling.sh): trains the
model of a Downpour job spec on Fashion-MNIST to a target test accuracy, on
one GPU (plain eager, one process) or under DDP, and reports time to target
and steady-state throughput.

  python3 bench/pytorch_train.py --model cnn --fashion DIR [--precision bf16]
  python3 -m torch.distributed.run --standalone --nproc_per_node=N \\
      bench/pytorch_train.py --model resnet18 --fashion DIR --t0 $(date +%s.%N)

What matches the job specs (examples/fashion_mnist_cnn.pbtxt,
examples/fashion_mnist_resnet18.pbtxt, examples/fashion_mnist_vgg11.pbtxt):
  model      bench/pytorch_step_time.py's cnn(), resnet18() and
             vgg11_bn_fashion(), the same layers
             (NCHW here, NHWC in ours: the same arithmetic); the example
             ResNet-18 takes 28x28x1 images, so its stem convolution is
             rebuilt with one input channel (pytorch_step_time's is CIFAR's
             3). Batch norm momentum 0.9 in ours is PyTorch's 0.1 (the
             other convention), epsilon 1e-5 in both. Initialisation is
             each system's own default (PyTorch's, seeded; ours He-uniform, or
             PyTorch's scale with `initializer: PYTORCH_DEFAULT`).
  data       the IDX .gz files of --fashion, pixels scaled exactly as our
             reader scales the importer's uint8 (data/example.cc: float32
             pixel * float32(1/255)), held in device memory once, reshuffled
             every epoch with a generator seeded by seed + epoch, sharded
             across DDP ranks as DistributedSampler does (pad to a multiple
             of the world size, rank::world), last partial batch kept.
  optimizer  Adam with the spec's learning rate (PyTorch's default betas and
             epsilon, the same as ours), batch --batch per GPU (128).
  precision  fp32: PyTorch's defaults untouched (TF32 convolutions, fp32
             matmuls); bf16: autocast to bfloat16 (tf32 and fp32_strict as
             bench/pytorch_step_time.py); cuDNN's benchmark mode on (ours
             measures its convolution algorithms too; --cudnn_benchmark 0
             turns it off).

The race: at most --epochs epochs, the whole test set evaluated after each
(by rank 0, in eval mode: batch norm's running statistics, rank 0's as DDP
broadcasts them), stop at the first evaluation >= --target. The clock starts
at --t0 (Unix seconds, taken by the shell that launched this process or
torchrun, so start-up counts; default: when this script started) and stops
when that evaluation is done.

Steady-state examples/s: training steps only (evaluations excluded), the GPU
synchronised at each window's ends; the windows are every epoch after the
first (or, when only one epoch ran, that epoch after its first 50 steps);
under DDP the per-rank rates are summed (global examples/s).

Rank 0 prints one JSON line per evaluation,
  {"eval": EPOCH, "t_s": SECONDS_SINCE_T0, "test_accuracy": X}
and a final one with system, shape, model, workers, gpus, shards, mode,
precision, batch_per_gpu, examples_per_s, time_to_target_s (null when not
reached), test_accuracy (the last), epochs_run, and details (target, steps,
startup_s: t0 to the first training step, device, torch).

Exits 2 with one message when PyTorch or CUDA is missing or --fashion lacks
the files. --device cpu (gloo under DDP) and --limit_steps N (at most N steps
an epoch) are for checking the script without a GPU.
"""
import time

T_SCRIPT = time.time()  # The default t0: as early as this process can see.

import argparse
import gzip
import json
import math
import os
import re
import struct
import sys

FILES = {
    'train_images': 'train-images-idx3-ubyte.gz',
    'train_labels': 'train-labels-idx1-ubyte.gz',
    'test_images': 't10k-images-idx3-ubyte.gz',
    'test_labels': 't10k-labels-idx1-ubyte.gz',
}
# The job specs the baselines mirror, and their race targets.
SPECS = {'cnn': 'fashion_mnist_cnn.pbtxt', 'resnet18': 'fashion_mnist_resnet18.pbtxt',
         'vgg11': 'fashion_mnist_vgg11.pbtxt'}
TARGETS = {'cnn': 0.90, 'resnet18': 0.92, 'vgg11': 0.92}


def is_rank0():
    return os.environ.get('RANK', '0') == '0'


def die(message):
    if is_rank0():
        print(f'pytorch_train.py: {message}', file=sys.stderr, flush=True)
    sys.exit(2)


def spec_value(model, field, default):
    """A numeric field of the example job spec (first occurrence), else default."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'examples', SPECS[model])
    try:
        text = open(path).read()
    except OSError:
        return default
    m = re.search(r'\b' + field + r'\s*:\s*([0-9.eE+-]+)', text)
    return float(m.group(1)) if m else default


def default_fashion_dir():
    return os.environ.get('FASHION_MNIST_DIR', '/usr/share/datasets/fashion-mnist')


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--model', choices=sorted(SPECS), default='cnn')
    p.add_argument('--fashion', default=None,
                   help='folder with the Fashion-MNIST IDX .gz files (default: $FASHION_MNIST_DIR, '
                   "else Debian's dataset-fashion-mnist folder)")
    p.add_argument('--batch', type=int, default=128, help='examples per GPU per step')
    p.add_argument('--lr', type=float, default=None, help="default: the job spec's learning_rate")
    p.add_argument('--epochs', type=int, default=15)
    p.add_argument('--target', type=float, default=None, help='default 0.90 cnn, 0.92 resnet18 and vgg11')
    p.add_argument('--precision', choices=['fp32', 'bf16', 'tf32', 'fp32_strict'], default='fp32')
    p.add_argument('--channels_last', action='store_true')
    p.add_argument('--cudnn_benchmark', type=int, default=1)
    p.add_argument('--t0', type=float, default=None,
                   help='Unix time (s) the clock starts at (default: this script started)')
    p.add_argument('--seed', type=int, default=1)
    p.add_argument('--device', choices=['cuda', 'cpu'], default='cuda')
    p.add_argument('--limit_steps', type=int, default=0,
                   help='at most this many training steps an epoch (0: the whole epoch)')
    p.add_argument('--eval_batch', type=int, default=1000)
    p.add_argument('--comm_hook', choices=['none', 'bf16'], default='none',
                   help="DDP's gradient all-reduce: fp32 (none, the default) or "
                        "torch.distributed.algorithms.ddp_comm_hooks.default_hooks."
                        "bf16_compress_hook")
    a = p.parse_args()
    if a.target is None:
        a.target = TARGETS[a.model]
    if a.lr is None:
        a.lr = spec_value(a.model, 'learning_rate', 0.001)
    if a.fashion is None:
        a.fashion = default_fashion_dir()
    return a


def read_idx(path, dims):
    """An IDX file of unsigned bytes: (shape, raw bytes)."""
    with gzip.open(path, 'rb') as f:
        data = f.read()
    magic, = struct.unpack('>I', data[:4])
    if magic != 0x0800 + dims:
        die(f'{path} is not an IDX file of {dims}-d unsigned bytes (magic {magic:#x})')
    shape = struct.unpack('>' + 'I' * dims, data[4:4 + 4 * dims])
    body = data[4 + 4 * dims:]
    if len(body) != math.prod(shape):
        die(f'{path}: {len(body)} bytes of data, the header says {shape}')
    return shape, body


def main():
    a = parse_args()
    t0 = a.t0 if a.t0 is not None else T_SCRIPT
    missing = [n for n in FILES.values() if not os.path.isfile(os.path.join(a.fashion, n))]
    if missing:
        die(f'--fashion {a.fashion} lacks {", ".join(missing)} (the Fashion-MNIST IDX .gz files)')
    try:
        import torch
        import torch.distributed as dist
        import torch.nn as nn
    except ImportError as e:
        die(f'PyTorch is not installed for {sys.executable} ({e}); install torch or run a Python '
            'that has it')
    if a.device == 'cuda' and not torch.cuda.is_available():
        die(f'CUDA is not available to PyTorch {torch.__version__} (built for CUDA '
            f'{torch.version.cuda}); run on a GPU machine, or pass --device cpu')
    from pytorch_step_time import Tf32Flags, cnn, resnet18, vgg11_bn_fashion

    ddp = 'RANK' in os.environ and 'WORLD_SIZE' in os.environ
    rank, world, local_rank = 0, 1, 0
    if ddp:
        rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
        local_rank = int(os.environ.get('LOCAL_RANK', '0'))
        if a.device == 'cuda':
            torch.cuda.set_device(local_rank)
        dist.init_process_group('nccl' if a.device == 'cuda' else 'gloo')
    dev = torch.device(a.device, local_rank) if a.device == 'cuda' else torch.device('cpu')
    cuda = dev.type == 'cuda'

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    flags = Tf32Flags()
    flags.apply(a.precision)
    torch.backends.cudnn.benchmark = bool(a.cudnn_benchmark)
    autocast = a.precision == 'bf16'

    # The data, scaled as data/example.cc: float32(pixel) * (1.0f / 255.0f),
    # the scale itself a float32 division.
    scale = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(255.0, dtype=torch.float32)

    def load(images, labels):
        (n, h, w), pixels = read_idx(os.path.join(a.fashion, FILES[images]), 3)
        (m,), ys = read_idx(os.path.join(a.fashion, FILES[labels]), 1)
        if m != n:
            die(f'{FILES[images]} holds {n} images but {FILES[labels]} {m} labels')
        x = torch.frombuffer(bytearray(pixels), dtype=torch.uint8).reshape(n, 1, h, w)
        y = torch.frombuffer(bytearray(ys), dtype=torch.uint8).long()
        return (x.float() * scale).to(dev), y.to(dev)

    x_train, y_train = load('train_images', 'train_labels')
    x_test, y_test = load('test_images', 'test_labels')
    n_train = x_train.shape[0]

    torch.manual_seed(a.seed)
    if a.model == 'cnn':
        model = cnn()
    elif a.model == 'vgg11':
        model = vgg11_bn_fashion()
    else:
        model = resnet18()
        # The example spec's ResNet-18 reads 28x28x1: a one-channel stem.
        model[0] = nn.Conv2d(1, 64, 3, 1, 1, bias=False)
    model = model.to(dev)
    with torch.no_grad():
        out = model.eval()(x_test[:2])
    if tuple(out.shape) != (2, 10):
        die(f'the {a.model} model gives {tuple(out.shape)} for 2 images, expected (2, 10)')
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
    net = model
    if ddp:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
        if a.comm_hook == 'bf16':
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            net.register_comm_hook(None, default_hooks.bf16_compress_hook)
    opt = torch.optim.Adam(net.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()

    def evaluate():
        model.eval()
        correct = torch.zeros((), dtype=torch.long, device=dev)
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            for i in range(0, x_test.shape[0], a.eval_batch):
                xb = x_test[i:i + a.eval_batch]
                if a.channels_last:
                    xb = xb.contiguous(memory_format=torch.channels_last)
                correct += (model(xb).argmax(1) == y_test[i:i + a.eval_batch]).sum()
        return correct.item() / x_test.shape[0]

    warm_steps = 50
    windows = []  # (epoch, seconds, examples) of this rank's training, per epoch
    first_window = None  # epoch 0 after its first warm_steps steps
    time_to_target, accuracy, epochs_run, steps_run, startup = None, None, 0, 0, None
    for epoch in range(a.epochs):
        g = torch.Generator()
        g.manual_seed(a.seed + epoch)
        order = torch.randperm(n_train, generator=g)
        total = math.ceil(n_train / world) * world
        if total > n_train:
            order = torch.cat([order, order[:total - n_train]])
        order = order[rank:total:world].to(dev)
        batches = math.ceil(order.shape[0] / a.batch)
        if a.limit_steps > 0:
            batches = min(batches, a.limit_steps)
        warm = min(warm_steps, batches // 2)
        net.train()
        sync()
        began = time.time()
        if startup is None:
            startup = began - t0
        examples, warm_began, warm_examples = 0, None, 0
        for b in range(batches):
            if epoch == 0 and b == warm:
                sync()
                warm_began, warm_examples = time.time(), examples
            ids = order[b * a.batch:(b + 1) * a.batch]
            xb, yb = x_train[ids], y_train[ids]
            if a.channels_last:
                xb = xb.contiguous(memory_format=torch.channels_last)
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
                loss = loss_fn(net(xb), yb)
            loss.backward()
            opt.step()
            examples += ids.shape[0]
        sync()
        ended = time.time()
        steps_run += batches
        windows.append((epoch, ended - began, examples))
        if epoch == 0 and warm_began is not None:
            first_window = (ended - warm_began, examples - warm_examples)
        # Rank 0 evaluates; every rank learns the result (and whether to stop).
        result = torch.zeros(1, dtype=torch.float64, device=dev)
        if rank == 0:
            result[0] = evaluate()
        if ddp:
            dist.broadcast(result, 0)
        accuracy = float(result[0])
        epochs_run = epoch + 1
        if rank == 0:
            t_s = time.time() - t0
            print(json.dumps({'eval': epochs_run, 't_s': round(t_s, 3),
                              'test_accuracy': accuracy}), flush=True)
            if accuracy >= a.target and time_to_target is None:
                time_to_target = t_s
        if accuracy >= a.target:
            break

    steady = [(s, n) for e, s, n in windows if e >= 1]
    if not steady and first_window is not None:
        steady = [first_window]
    seconds = sum(s for s, _ in steady)
    rate = sum(n for _, n in steady) / seconds if seconds > 0 else 0.0
    if ddp:
        rates = torch.tensor([rate], dtype=torch.float64, device=dev)
        dist.all_reduce(rates)
        rate = float(rates[0])
    if rank == 0:
        gpus = world if cuda else 0
        if not ddp:
            shape = f'1 process x 1 {"GPU" if cuda else "CPU"}'
        elif cuda:
            shape = f'DDP {world} GPU{"s" if world > 1 else ""}'
        else:
            shape = f'DDP {world} CPU process{"es" if world > 1 else ""}'
        print(json.dumps({
            'system': 'pytorch_ddp' if ddp else 'pytorch',
            'shape': shape,
            'model': a.model, 'workers': world, 'gpus': gpus, 'shards': 0,
            'mode': 'DDP' if ddp else 'single', 'precision': a.precision,
            'batch_per_gpu': a.batch, 'examples_per_s': round(rate, 1),
            'time_to_target_s': None if time_to_target is None else round(time_to_target, 3),
            'test_accuracy': accuracy, 'epochs_run': epochs_run,
            'target': a.target, 'steps': steps_run, 'startup_s': round(startup or 0.0, 3),
            'channels_last': a.channels_last, 'cudnn_benchmark': bool(a.cudnn_benchmark),
            'comm_hook': a.comm_hook,
            'lr': a.lr, 'device': torch.cuda.get_device_name(dev) if cuda else 'cpu',
            'torch': torch.__version__,
        }), flush=True)
    if ddp:
        dist.destroy_process_group()


if __name__ == '__main__':
    main()
