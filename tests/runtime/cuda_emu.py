"""Run the runtime's CUDA C kernels on the CPU: the source compiled as C++ with one OS thread per CUDA thread.

A test helper for machines without a GPU. The kernel source the GPU drivers
get (minus the PTX half-precision conversions, replaced by _Float16) is
compiled with g++ against a small emulation of the CUDA execution model:
blocks run one after another, each with blockDim threads; __syncthreads is a
block barrier, warp shuffles exchange through per-warp slots and barriers,
__shared__ memory is per-block (blocks never overlap). A numpy-format
executable whose functions launch these kernels lets the whole runtime run
its GPU kernels on a CPU driver.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from runtime.kernels.cuda_common import COMMON

GXX = shutil.which("g++")

PRELUDE = r"""
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
#include <cstdint>
#include <utility>
#include <type_traits>
#include <tuple>
struct rt_dim3 { unsigned x, y, z; };
static thread_local rt_dim3 threadIdx, blockIdx;
static rt_dim3 blockDim, gridDim;
static std::barrier<>* rt_block_barrier;
static std::vector<std::barrier<>*> rt_warp_barriers;
static uint64_t rt_slots[1024];
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define RT_WARP 32
static inline void __syncthreads() { rt_block_barrier->arrive_and_wait(); }
template <typename T> static T rt_shfl_down(T v, int o) {
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned lane = t % 32, warp = t / 32;
  uint64_t bits = 0; std::memcpy(&bits, &v, sizeof(T));
  rt_slots[t] = bits;
  rt_warp_barriers[warp]->arrive_and_wait();
  T r = v;
  if (lane + o < 32) { uint64_t b = rt_slots[t + o]; std::memcpy(&r, &b, sizeof(T)); }
  rt_warp_barriers[warp]->arrive_and_wait();
  return r;
}
#define RT_SHFL_DOWN(v, o) rt_shfl_down((v), (o))
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
using std::min; using std::max;
static inline float f16_to_f32(unsigned short h) { _Float16 v; std::memcpy(&v, &h, 2); return (float)v; }
static inline unsigned short f32_to_f16(float f) {
  _Float16 v = (_Float16)f; unsigned short h; std::memcpy(&h, &v, 2); return h;
}
template <typename T> static inline T rt_load_once(const T* p) { return *p; }
template <typename T> static inline T rt_load_l2(const T* p) { return *p; }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return std::atomic_ref<unsigned>(*p).fetch_add(v);
}
"""

LAUNCHER = r"""
template <typename... P, std::size_t... I>
static void rt_call(void (*k)(P...), void** ptrs, const unsigned* consts, std::index_sequence<I...>) {
  constexpr int nptr = (0 + ... + (std::is_pointer_v<P> ? 1 : 0));
  auto arg = [&](auto idx) {
    constexpr std::size_t i = decltype(idx)::value;
    using T = std::tuple_element_t<i, std::tuple<P...>>;
    if constexpr (std::is_pointer_v<T>) return (T)ptrs[i];
    else return (T)consts[i - nptr];
  };
  k(arg(std::integral_constant<std::size_t, I>{})...);
}
template <typename... P>
static void rt_launch(void (*k)(P...), void** ptrs, const unsigned* consts,
                      const unsigned* grid, const unsigned* block) {
  gridDim = {grid[0], grid[1], grid[2]};
  blockDim = {block[0], block[1], block[2]};
  const unsigned nthreads = block[0] * block[1] * block[2];
  const unsigned nwarps = (nthreads + 31) / 32;
  for (unsigned bz = 0; bz < grid[2]; ++bz)
  for (unsigned by = 0; by < grid[1]; ++by)
  for (unsigned bx = 0; bx < grid[0]; ++bx) {
    std::barrier<> block_barrier(nthreads);
    rt_block_barrier = &block_barrier;
    std::vector<std::barrier<>*> warps;
    for (unsigned w = 0; w < nwarps; ++w) warps.push_back(new std::barrier<>(std::min(32u, nthreads - 32 * w)));
    rt_warp_barriers = warps;
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < nthreads; ++t) {
      threads.emplace_back([=]() {
        blockIdx = {bx, by, bz};
        threadIdx = {t % block[0], (t / block[0]) % block[1], t / (block[0] * block[1])};
        rt_call(k, ptrs, consts, std::index_sequence_for<P...>{});
      });
    }
    for (auto& th : threads) th.join();
    for (auto* w : warps) delete w;
  }
}
"""

_CACHE = Path(os.environ.get("RUNTIME_EMU_CACHE", Path(tempfile.gettempdir()) / "runtime-cuda-emu"))


def build(src) -> ctypes.CDLL:
    """Compile one KernelSource's CUDA C for the CPU; returns the library with launch_<export> entry points."""
    body = src._cuda_fn()
    launchers = "".join(
        f'extern "C" void launch_{e.name}(void** p, const unsigned* c, const unsigned* g, const unsigned* b)'
        f" {{ rt_launch({e.name}, p, c, g, b); }}\n" for e in src.exports)
    code = PRELUDE + COMMON + body + LAUNCHER + launchers
    digest = hashlib.sha256(code.encode()).hexdigest()[:20]
    _CACHE.mkdir(parents=True, exist_ok=True)
    lib = _CACHE / f"{digest}.so"
    if not lib.exists():
        cpp = _CACHE / f"{digest}.cpp"
        cpp.write_text(code)
        tmp = _CACHE / f"{digest}.{os.getpid()}.so"
        subprocess.run([GXX, "-std=c++20", "-O1", "-w", "-shared", "-fPIC", "-pthread", str(cpp), "-o", str(tmp)],
                       check=True, capture_output=True, text=True)
        os.replace(tmp, lib)
    return ctypes.CDLL(str(lib))


def emulated_code(src) -> dict:
    """{export name: numpy-format callable} launching the emulated CUDA kernels on the bound memory."""
    lib = build(src)
    fns = {}
    for export in src.exports:
        launch = getattr(lib, f"launch_{export.name}")
        block = (ctypes.c_uint * 3)(*export.workgroup_size)

        def run(workgroups, bindings, constants, launch=launch, block=block):
            arrays = [np.frombuffer(b, dtype=np.uint8) for b in bindings]
            ptrs = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
            consts = (ctypes.c_uint * max(1, len(constants)))(*constants)
            wg = tuple(workgroups) if not isinstance(workgroups, int) else (workgroups, 1, 1)
            grid = (ctypes.c_uint * 3)(*wg)
            if 0 in wg:
                return
            launch(ptrs, consts, grid, block)
        fns[export.name] = run
    return fns


_emulated: dict = {}


@contextlib.contextmanager
def emulated_kernels():
    """Within the block, the runtime's numpy-format kernels are its CUDA C kernels built with g++."""
    from runtime.kernels.source import KernelSource

    original = KernelSource.numpy_code

    def emulated(self):
        code = _emulated.get(self.key)
        if code is None:
            code = _emulated[self.key] = emulated_code(self)
        return code

    KernelSource.numpy_code = emulated
    try:
        yield
    finally:
        KernelSource.numpy_code = original
