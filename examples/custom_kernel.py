"""Record a command buffer with a custom kernel, submit it, and check the result.

The kernel comes in every format a driver might prepare (CUDA C, HIP C, numpy);
``load_executable`` takes the first one the device supports, so this runs
unchanged on cuda, hip, local-task and local-sync.

    python examples/custom_kernel.py [--device URI] [--n N]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import hal

SAXPY_CUDA = r"""
extern "C" __global__ void saxpy(const float* x, float* y, unsigned int n, unsigned int a_bits) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += __uint_as_float(a_bits) * x[i];
}
"""
WORKGROUP = 256


def saxpy_numpy(workgroups, bindings, constants):
    """The same kernel for the CPU drivers: one 'thread' per element of the grid."""
    n, a_bits = constants
    count = min(n, workgroups[0] * WORKGROUP)
    x = np.frombuffer(bindings[0], np.float32, count)
    y = np.frombuffer(bindings[1], np.float32, count)
    y += np.uint32(a_bits).view(np.float32) * x


def saxpy_specs() -> list[hal.ExecutableSpec]:
    export = [hal.Export("saxpy", workgroup_size=(WORKGROUP, 1, 1), bindings=2, constants=2)]
    return [
        hal.ExecutableSpec("cuda-c", SAXPY_CUDA, export),
        hal.ExecutableSpec("hip-c", "#include <hip/hip_runtime.h>\n" + SAXPY_CUDA, export),
        hal.ExecutableSpec("numpy", saxpy_numpy, export),
    ]


def run(device: hal.Device, n: int, a: float = 2.5) -> float:
    """y = a*x + y on the device; returns the largest error against numpy."""
    rng = np.random.default_rng(0)
    x_host = rng.standard_normal(n, dtype=np.float32)
    y_host = rng.standard_normal(n, dtype=np.float32)
    executable = device.load_executable(saxpy_specs())
    with device.allocator.allocate(x_host.nbytes) as x, device.allocator.allocate(y_host.nbytes) as y:
        device.write(x, x_host)
        device.write(y, y_host)
        done = device.create_semaphore(0)
        cb = device.create_command_buffer()
        with cb.record():
            cb.dispatch(
                executable,
                "saxpy",
                workgroups=(-(-n // WORKGROUP), 1, 1),
                constants=[n, int(np.float32(a).view(np.uint32))],
                bindings=[x, y],
            )
            cb.execution_barrier()
            cb.fill_buffer((x, 0, 4), pattern=0x3F800000, pattern_length=4)  # x[0] = 1.0
        device.queue_execute([cb], signal=[(done, 1)])
        done.wait(1, timeout=60)
        result = np.frombuffer(device.read(y), np.float32)
        first = np.frombuffer(device.read(x, 0, 4), np.float32)[0]
    expected = np.float32(a) * x_host + y_host
    if first != 1.0:
        raise AssertionError(f"fill after the barrier wrote {first}, expected 1.0")
    return float(np.max(np.abs(result - expected)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device",
        default=None,
        help="HAL device URI such as local-task or cuda://0 (default: $HAL_DEVICE, else the best available)",
    )
    parser.add_argument("--n", type=int, default=1 << 20, help="vector length (at least 1, default: %(default)s)")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"--n must be at least 1, got {args.n}")
    try:
        device = hal.create_device(args.device)
    except hal.HalError as exc:  # a bad --device or HAL_DEVICE: one line, not a traceback
        where = f"--device {args.device!r}: " if args.device else ""
        parser.exit(2, f"{parser.prog}: {where}{exc}\n")
    with device:
        print(f"device: {device.info.uri} ({device.info.name})")
        error = run(device, args.n)
        ok = error <= 1e-5
        print(f"saxpy over {args.n} floats: max error vs numpy {error:.2e} -> {'OK' if ok else 'MISMATCH'}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
