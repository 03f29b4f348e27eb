#!/usr/bin/env python3
"""PyTorch eager baseline for //bench:step_time: the same four models, batch,
precision and optimizer (Adam), one training step = forward + backward +
optimizer step on one GPU, data already on the device.

Models match bench/models/*.pbtxt layer for layer (NCHW here, NHWC in ours;
the arithmetic is the same). The precisions are named as //bench:step_time's
(proto/job.proto's Precision):
  fp32         PyTorch's defaults, untouched (torch.backends.cudnn.allow_tf32
               and torch.backends.cuda.matmul.allow_tf32 as this process
               found them: True and False unless the installation says
               otherwise): convolutions on TF32 tensor cores, matmuls fp32;
  tf32         both allowed;
  fp32_strict  both off (no TF32 anywhere);
  bf16         autocast, with the defaults;
  fp16         autocast with a GradScaler (dynamic loss scaling), defaults.

Prints a header line with the defaults found, then one JSON line per
(model, precision, memory format):
  {"model", "precision", "format", "batch", "cudnn_allow_tf32",
   "matmul_allow_tf32", "step_ms_median", "step_ms_p10", "step_ms_p90",
   "step_ms_loop", "peak_mem_mb", "final_loss"}
Usage: python3 bench/pytorch_step_time.py [--steps 50] [--models mlp,cnn,...]
         [--precisions fp32,tf32,fp32_strict,bf16]
"""
import argparse
import json
import statistics
import warnings

import torch
import torch.nn as nn


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(7 * 7 * 64, 128), nn.ReLU(), nn.Linear(128, 10))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        s = x if self.down is None else self.down(x)
        return torch.relu(y + s)


def resnet18():
    layers = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()]
    cin = 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers)


def vgg11():
    layers, cin = [], 3
    for v in [64, 'M', 128, 'M', 256, 256, 'M', 512, 512, 'M', 512, 512, 'M']:
        if v == 'M':
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU()]
            cin = v
    layers += [nn.Flatten(), nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Linear(4096, 4096),
               nn.ReLU(), nn.Linear(4096, 1000)]
    return nn.Sequential(*layers)


def vgg11_bn_fashion():
    """examples/fashion_mnist_vgg11.pbtxt: VGG-11 with batch norm on 28x28x1
    Fashion-MNIST images, four pools (28 -> 1), a 4096-4096-10 classifier."""
    layers, cin = [], 1
    for v in [64, 128, 'M', 256, 256, 'M', 512, 512, 'M', 512, 512, 'M']:
        if v == 'M':
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(cin, v, 3, padding=1, bias=False), nn.BatchNorm2d(v), nn.ReLU()]
            cin = v
    layers += [nn.Flatten(), nn.Linear(512, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
               nn.Linear(4096, 10)]
    return nn.Sequential(*layers)


# (cuDNN convolutions, cuBLAS matmuls) may use TF32, per precision; None:
# PyTorch's defaults.
TF32 = {
    'fp32': None,
    'tf32': (True, True),
    'fp32_strict': (False, False),
    'bf16': None,
    'fp16': None,
}


class Tf32Flags:
    """torch.backends' TF32 switches, through the allow_tf32 attributes
    (PyTorch 2.9+ warns that they will be replaced by fp32_precision; they
    still set both and stay consistent with each other)."""

    def __init__(self):
        self.defaults = self.read()

    @staticmethod
    def read():
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            return (bool(torch.backends.cudnn.allow_tf32),
                    bool(torch.backends.cuda.matmul.allow_tf32))

    def apply(self, precision):
        """Sets precision's flags; returns (cudnn, matmul) as set."""
        conv, matmul = TF32[precision] or self.defaults
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            torch.backends.cudnn.allow_tf32 = conv
            torch.backends.cuda.matmul.allow_tf32 = matmul
        return conv, matmul


MODELS = {
    # name: (constructor, input shape CHW, classes, batch)
    'mlp': (mlp, (1, 28, 28), 10, 256),
    'cnn': (cnn, (1, 28, 28), 10, 256),
    'resnet18': (resnet18, (3, 32, 32), 10, 256),
    'vgg11': (vgg11, (3, 224, 224), 1000, 64),
}


def time_model(name, precision, channels_last, steps, warmup, flags):
    ctor, chw, classes, batch = MODELS[name]
    cudnn_tf32, matmul_tf32 = flags.apply(precision)
    torch.manual_seed(0)
    dev = torch.device('cuda')
    model = ctor().to(dev)
    x = torch.randn(batch, *chw, device=dev)
    y = torch.randint(0, classes, (batch,), device=dev)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    # fp16: dynamic loss scaling, as ours (its step reads the inf/NaN flag
    # back on the host, as ours does).
    scaler = torch.amp.GradScaler('cuda', enabled=precision == 'fp16')
    dtype = torch.float16 if precision == 'fp16' else torch.bfloat16
    autocast = precision in ('bf16', 'fp16')

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast('cuda', dtype=dtype, enabled=autocast):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    # Per-step events, no host sync inside the loop (as a training loop runs).
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(steps)]
    for s, e in events:
        s.record()
        loss = step()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in events)
    # Steady state from the host side too: total wall of the loop / steps.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        loss = step()
    end.record()
    torch.cuda.synchronize()
    return {
        'engine': 'pytorch', 'model': name, 'precision': precision,
        'format': 'channels_last' if channels_last else 'nchw', 'batch': batch,
        'cudnn_allow_tf32': cudnn_tf32, 'matmul_allow_tf32': matmul_tf32,
        'step_ms_median': statistics.median(times), 'step_ms_p10': times[len(times) // 10],
        'step_ms_p90': times[(len(times) * 9) // 10],
        'step_ms_loop': start.elapsed_time(end) / steps,
        'peak_mem_mb': torch.cuda.max_memory_allocated() / 2**20,
        'final_loss': float(loss.item()),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--steps', type=int, default=50)
    p.add_argument('--warmup', type=int, default=10)
    p.add_argument('--models', default='mlp,cnn,resnet18,vgg11')
    p.add_argument('--precisions', default='fp32,tf32,fp32_strict,bf16')
    p.add_argument('--channels_last', default='0,1')
    a = p.parse_args()
    precisions = a.precisions.split(',')
    for precision in precisions:
        if precision not in TF32:
            p.error(f'unknown precision {precision!r}; known: {", ".join(TF32)}')
    flags = Tf32Flags()
    torch.backends.cudnn.benchmark = True
    print(json.dumps({'engine': 'pytorch', 'torch': torch.__version__,
                      'device': torch.cuda.get_device_name(0),
                      'cudnn': torch.backends.cudnn.version(),
                      'default_cudnn_allow_tf32': flags.defaults[0],
                      'default_matmul_allow_tf32': flags.defaults[1]}), flush=True)
    for name in a.models.split(','):
        for precision in precisions:
            for cl in a.channels_last.split(','):
                if cl == '1' and name == 'mlp':
                    continue
                r = time_model(name, precision, cl == '1', a.steps, a.warmup, flags)
                print(json.dumps(r), flush=True)
                torch.cuda.empty_cache()


if __name__ == '__main__':
    main()
