"""The conformance suite's kernels, written once per executable format.

Every kernel exists as a numpy implementation (format "numpy", for the CPU
drivers) and as CUDA C (format "cuda-c"; HIP compiles the same text after a
small prelude, format "hip-c"). `load_kernels(device)` hands all three specs
to `device.load_executable`, which keeps the first format the device can
prepare, so every test runs unchanged on every driver.

The numpy versions model the GPU execution exactly: one thread per element,
`workgroups[0] * workgroups[1] * workgroups[2] * workgroup_size` threads in
all, each thread guarded by the constant `n`. A test that dispatches fewer
threads than elements therefore sees the same partial result everywhere.
All integer arithmetic is uint32 and wraps, as it does in C.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

import hal

WORKGROUP_SIZE = 64

NumpyKernel = Callable[[Sequence[int], Sequence[memoryview], Sequence[int]], None]


class CtsKernelError(RuntimeError):
    """Raised by the numpy version of the deliberately failing kernel."""


@dataclass(frozen=True)
class Kernel:
    name: str
    bindings: int
    constants: int
    numpy_fn: NumpyKernel
    cuda_source: str
    workgroup_size: int = WORKGROUP_SIZE

    def export(self) -> hal.Export:
        return hal.Export(
            self.name,
            workgroup_size=(self.workgroup_size, 1, 1),
            bindings=self.bindings,
            constants=self.constants,
        )


# ---------------------------------------------------------------------------
# The GPU thread model, in numpy.


def normalize_workgroups(workgroups: int | Sequence[int]) -> tuple[int, int, int]:
    if isinstance(workgroups, int):
        return (workgroups, 1, 1)
    dims = tuple(int(w) for w in workgroups)
    return dims + (1,) * (3 - len(dims))  # type: ignore[return-value]


def thread_count(workgroups: int | Sequence[int], workgroup_size: int = WORKGROUP_SIZE) -> int:
    x, y, z = normalize_workgroups(workgroups)
    return x * y * z * workgroup_size


def active_threads(n: int, workgroups: int | Sequence[int], workgroup_size: int = WORKGROUP_SIZE) -> int:
    """How many of the elements [0, n) some thread of the grid touches."""
    return min(n, thread_count(workgroups, workgroup_size))


def u32(view: memoryview) -> np.ndarray:
    """A writable uint32 array over a binding (whole words only)."""
    return np.frombuffer(view, dtype=np.uint32, count=len(view) // 4)


def f32(view: memoryview) -> np.ndarray:
    return np.frombuffer(view, dtype=np.float32, count=len(view) // 4)


def f32_bits(value: float) -> int:
    """The uint32 bit pattern of a float32, the way float constants are passed."""
    return int(np.array([value], dtype=np.float32).view(np.uint32)[0])


def bits_f32(bits: int) -> np.float32:
    return np.array([bits & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]


# ---------------------------------------------------------------------------
# Kernels. Each numpy function takes (workgroups, bindings, constants).


def _iota(workgroups, bindings, constants):
    (out,) = bindings
    (n,) = constants
    m = active_threads(n, workgroups)
    u32(out)[:m] = np.arange(m, dtype=np.uint32)


def _saxpy(workgroups, bindings, constants):
    x_view, y_view = bindings
    n, a_bits = constants
    m = active_threads(n, workgroups)
    x, y = f32(x_view), f32(y_view)
    # Two separately rounded float32 operations, as __fmul_rn/__fadd_rn.
    product = (bits_f32(a_bits) * x[:m]).astype(np.float32)
    y[:m] = (product + y[:m]).astype(np.float32)


def _add_one(workgroups, bindings, constants):
    (buf,) = bindings
    (n,) = constants
    m = active_threads(n, workgroups)
    values = u32(buf)
    values[:m] = values[:m] + np.uint32(1)


def _copy_offset(workgroups, bindings, constants):
    src_view, dst_view = bindings
    n, src_offset, dst_offset = constants
    m = active_threads(n, workgroups)
    src, dst = u32(src_view), u32(dst_view)
    dst[dst_offset : dst_offset + m] = src[src_offset : src_offset + m]


def _mix3(workgroups, bindings, constants):
    a_view, b_view, out_view = bindings
    (n,) = constants
    m = active_threads(n, workgroups)
    a, b, out = u32(a_view), u32(b_view), u32(out_view)
    # Asymmetric in its three inputs, so a binding order mistake shows.
    out[:m] = a[:m] + np.uint32(2) * b[:m] + np.uint32(3) * out[:m]


def _fill_constant(workgroups, bindings, constants):
    (out,) = bindings
    n, value = constants
    m = active_threads(n, workgroups)
    u32(out)[:m] = np.uint32(value)


def workgroup_id_words(count: int, workgroups: int | Sequence[int], workgroup_size: int = WORKGROUP_SIZE) -> np.ndarray:
    """Per thread, its workgroup coordinates packed as bz << 20 | by << 10 | bx."""
    gx, gy, _ = normalize_workgroups(workgroups)
    gid = np.arange(count, dtype=np.uint64)
    block = gid // workgroup_size
    bx = block % gx
    by = (block // gx) % gy
    bz = block // (gx * gy)
    return ((bz << 20) | (by << 10) | bx).astype(np.uint32)


def _workgroup_id(workgroups, bindings, constants):
    (out,) = bindings
    (n,) = constants
    m = active_threads(n, workgroups)
    u32(out)[:m] = workgroup_id_words(m, workgroups)


def _fail(workgroups, bindings, constants):
    (n,) = constants
    raise CtsKernelError(f"cts_fail kernel failed on purpose (n={n})")


CUDA_PRELUDE = r"""
#ifndef CTS_TRAP
#define CTS_TRAP() asm volatile("trap;")
#endif
__device__ __forceinline__ unsigned int cts_global_id() {
  unsigned int block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  return block * blockDim.x + threadIdx.x;
}
"""

HIP_PRELUDE = r"""#ifndef __HIPCC_RTC__  // hiprtc declares the HIP runtime itself (ROCm 5.2 has no such header)
#include <hip/hip_runtime.h>
#endif
#define CTS_TRAP() __builtin_trap()
"""

KERNELS: dict[str, Kernel] = {
    k.name: k
    for k in [
        Kernel(
            "cts_iota",
            1,
            1,
            _iota,
            r"""
extern "C" __global__ void cts_iota(unsigned int* out, unsigned int n) {
  unsigned int i = cts_global_id();
  if (i < n) out[i] = i;
}
""",
        ),
        Kernel(
            "cts_saxpy",
            2,
            2,
            _saxpy,
            r"""
extern "C" __global__ void cts_saxpy(const float* x, float* y, unsigned int n, unsigned int a_bits) {
  unsigned int i = cts_global_id();
  if (i < n) y[i] = __fadd_rn(__fmul_rn(__uint_as_float(a_bits), x[i]), y[i]);
}
""",
        ),
        Kernel(
            "cts_add_one",
            1,
            1,
            _add_one,
            r"""
extern "C" __global__ void cts_add_one(unsigned int* buf, unsigned int n) {
  unsigned int i = cts_global_id();
  if (i < n) buf[i] += 1u;
}
""",
        ),
        Kernel(
            "cts_copy_offset",
            2,
            3,
            _copy_offset,
            r"""
extern "C" __global__ void cts_copy_offset(const unsigned int* src, unsigned int* dst, unsigned int n,
                                           unsigned int src_offset, unsigned int dst_offset) {
  unsigned int i = cts_global_id();
  if (i < n) dst[dst_offset + i] = src[src_offset + i];
}
""",
        ),
        Kernel(
            "cts_mix3",
            3,
            1,
            _mix3,
            r"""
extern "C" __global__ void cts_mix3(const unsigned int* a, const unsigned int* b, unsigned int* out,
                                    unsigned int n) {
  unsigned int i = cts_global_id();
  if (i < n) out[i] = a[i] + 2u * b[i] + 3u * out[i];
}
""",
        ),
        Kernel(
            "cts_fill_constant",
            1,
            2,
            _fill_constant,
            r"""
extern "C" __global__ void cts_fill_constant(unsigned int* out, unsigned int n, unsigned int value) {
  unsigned int i = cts_global_id();
  if (i < n) out[i] = value;
}
""",
        ),
        Kernel(
            "cts_workgroup_id",
            1,
            1,
            _workgroup_id,
            r"""
extern "C" __global__ void cts_workgroup_id(unsigned int* out, unsigned int n) {
  unsigned int i = cts_global_id();
  if (i < n) out[i] = (blockIdx.z << 20) | (blockIdx.y << 10) | blockIdx.x;
}
""",
        ),
        Kernel(
            "cts_fail",
            1,
            1,
            _fail,
            r"""
extern "C" __global__ void cts_fail(unsigned int* out, unsigned int n) {
  if (cts_global_id() == 0) CTS_TRAP();
  if (cts_global_id() < n) out[cts_global_id()] = 0u;
}
""",
        ),
    ]
}

EXPORT_NAMES = list(KERNELS)


def cuda_source(names: Sequence[str] | None = None) -> str:
    chosen = EXPORT_NAMES if names is None else names
    return CUDA_PRELUDE + "".join(KERNELS[name].cuda_source for name in chosen)


def hip_source(names: Sequence[str] | None = None) -> str:
    return HIP_PRELUDE + cuda_source(names)


def specs(names: Sequence[str] | None = None) -> list[hal.ExecutableSpec]:
    """The numpy, cuda-c and hip-c specs of the chosen kernels, in that order."""
    chosen = EXPORT_NAMES if names is None else list(names)
    exports = [KERNELS[name].export() for name in chosen]
    return [
        hal.ExecutableSpec("numpy", {name: KERNELS[name].numpy_fn for name in chosen}, exports),
        hal.ExecutableSpec("cuda-c", cuda_source(chosen), exports),
        hal.ExecutableSpec("hip-c", hip_source(chosen), exports),
    ]


# The numpy code objects must be the same objects on every call, so that
# loading the kernels twice hits the device's executable cache.
_ALL_SPECS = specs()


def load_kernels(device: hal.Device) -> hal.Executable:
    """All CTS kernels as one executable in the first format the device prepares."""
    return device.load_executable(_ALL_SPECS)


def groups_for(n: int, workgroup_size: int = WORKGROUP_SIZE) -> tuple[int, int, int]:
    """Just enough workgroups for one thread per element."""
    return (-(-n // workgroup_size), 1, 1)
