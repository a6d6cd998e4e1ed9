"""Train logistic regression on synthetic, linearly separable data with the lazy array runtime.

    python examples/logistic_regression.py [--samples 8192] [--features 512] [--steps 2000]
                                           [--lr 2.0] [--device URI] [--compile]

Every step is one full-batch gradient step computed with rt.value_and_grad:
the forward and backward graphs are built lazily and evaluated in one
submission, which the graph cache replays from the second step on. With
--compile the whole step is traced once by rt.compile and then only rebound
and resubmitted.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import hal
import runtime as rt

DEVICE_HELP = "HAL device URI such as local-task or cuda://0 (default: $HAL_DEVICE, else the best available)"


def make_data(samples: int, features: int, device):
    """Gaussian inputs labelled by a random hyperplane through the origin: separable by construction."""
    kx, kw = rt.random.split(rt.random.key(0, device=device))
    X = rt.random.normal((samples, features), key=kx)
    w_true = rt.random.normal((features,), key=kw)
    y = (X @ w_true > 0).astype(rt.float32)
    rt.eval(X, y)
    return X, y


def loss_fn(w, X, y):
    """Mean binary cross-entropy of sigmoid(X @ w), in the stable softplus form."""
    z = X @ w
    softplus = rt.maximum(z, 0.0) + rt.log(1.0 + rt.exp(-abs(z)))
    return (softplus - y * z).mean()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--samples", type=int, default=8192, help="training examples (at least 1, default: %(default)s)")
    add("--features", type=int, default=512, help="features per example (at least 1, default: %(default)s)")
    add("--steps", type=int, default=2000, help="gradient steps after the warm-up step (default: %(default)s)")
    add("--lr", type=float, default=2.0, help="learning rate (positive, default: %(default)s)")
    add("--device", default=None, help=DEVICE_HELP)
    add("--compile", action="store_true", help="trace the step once with rt.compile (default: off)")
    add("--print-every", type=int, default=200, help="print the loss every N steps (default: %(default)s)")
    args = parser.parse_args(argv)
    for flag in ("samples", "features", "steps", "print_every"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if not math.isfinite(args.lr) or args.lr <= 0:
        parser.error(f"--lr must be a positive number, got {args.lr}")

    try:
        device = rt.set_default_device(args.device) if args.device else rt.default_device()
    except hal.HalError as exc:  # a bad --device or HAL_DEVICE: one line, not a traceback
        where = f"--device {args.device!r}: " if args.device else ""
        parser.exit(2, f"{parser.prog}: {where}{exc}\n")
    info = device.info
    print(f"device: {info.name} ({info.uri}, driver {info.driver})")
    print(f"data: {args.samples} samples x {args.features} features, {args.steps} full-batch steps, lr {args.lr}")

    X, y = make_data(args.samples, args.features, device)
    value_and_grad = rt.value_and_grad(loss_fn)

    def step(w, X, y):
        loss, g = value_and_grad(w, X, y)
        return w - args.lr * g, loss

    if args.compile:
        step = rt.compile(step)
    w = rt.zeros((args.features,))
    w, loss = step(w, X, y)  # warm-up: kernels loaded, graph recorded
    rt.eval(w, loss)
    first_loss = float(loss)

    bar = None
    if sys.stdout.isatty():
        try:  # a progress bar where tqdm is installed (pip install 'hal-gpu[examples]')
            from tqdm import tqdm

            bar = tqdm(total=args.steps, unit="step", leave=False)
        except ImportError:
            bar = None
    start = time.perf_counter()
    for i in range(1, args.steps + 1):
        w, loss = step(w, X, y)
        rt.eval(w, loss)
        if bar is not None:
            bar.update(1)
        if i % args.print_every == 0 or i == args.steps:
            msg = f"step {i:5d}  loss {float(loss):.4f}"
            if bar is not None:
                bar.write(msg)
            else:
                print(msg, flush=True)
    rt.synchronize()
    elapsed = time.perf_counter() - start
    if bar is not None:
        bar.close()

    accuracy = float(((X @ w > 0).astype(rt.float32) == y).astype(rt.float32).mean())
    print(f"loss {first_loss:.4f} -> {float(loss):.4f}")
    print(f"accuracy {accuracy:.4f}")
    print(f"throughput {args.steps / elapsed:.1f} it/s ({elapsed:.2f} s for {args.steps} steps)")
    return 0 if accuracy > 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
