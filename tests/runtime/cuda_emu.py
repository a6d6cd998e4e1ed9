"""Run the runtime's CUDA C kernels on the CPU: the source compiled as C++, one fiber per CUDA thread.

A test helper for machines without a GPU. The kernel source the GPU drivers
get (minus the PTX half-precision conversions, replaced by _Float16) is
compiled with g++ against a small emulation of the CUDA execution model:
blocks run one after another, each with blockDim threads (fibers on the
launching thread); __syncthreads is a block barrier, warp shuffles exchange
through per-warp slots and barriers, __shared__ memory is per-block (blocks
never overlap). A numpy-format executable whose functions launch these
kernels lets the whole runtime run its GPU kernels on a CPU driver.
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

# The execution model, compiled once per cache. A block's CUDA threads are fibers (ucontext) on the
# launching thread, each run until it waits at a barrier (__syncthreads, or a warp's shuffle) or ends;
# a barrier opens when every thread it spans has arrived. OS threads per CUDA thread spent most of
# an emulated test's time in the kernel's futex calls (256 threads a block on a few cores).
THREADS = r"""
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <ucontext.h>
struct rt_dim3 { unsigned x, y, z; };
__thread rt_dim3 threadIdx, blockIdx, blockDim, gridDim;
namespace {
enum class At { run, block, warp, done };
struct Fiber { ucontext_t context; At at; rt_dim3 index; };
struct Launch {
  ucontext_t scheduler;
  std::vector<Fiber> fibers;
  char* stacks = nullptr;  // (malloc'd: pages untouched until a fiber's stack reaches them)
  unsigned current = 0;
  uint64_t slots[1024];
  void (*body)(void*);
  void* args;
};
constexpr size_t STACK = 256 * 1024;
__thread Launch* rt_launch_now;

void fiber_entry() {
  Launch* l = rt_launch_now;
  l->body(l->args);
  l->fibers[l->current].at = At::done;  // (returns to the scheduler through uc_link)
}

void wait_at(At at) {
  Launch* l = rt_launch_now;
  Fiber& f = l->fibers[l->current];
  f.at = at;
  swapcontext(&f.context, &l->scheduler);
}

// Runs every runnable fiber until it waits or ends, then opens the barriers everyone has reached;
// false when nothing can run (a barrier some thread never reaches: a hang on the GPU).
bool step(Launch& l, unsigned nwarps) {
  for (unsigned t = 0; t < l.fibers.size(); ++t) {
    Fiber& f = l.fibers[t];
    if (f.at != At::run) continue;
    l.current = t;
    threadIdx = f.index;
    swapcontext(&l.scheduler, &f.context);
  }
  bool opened = false;
  for (unsigned w = 0; w < nwarps; ++w) {
    const unsigned t0 = 32 * w, t1 = t0 + 32 < l.fibers.size() ? t0 + 32 : l.fibers.size();
    bool all = true;
    for (unsigned t = t0; t < t1; ++t) all = all && l.fibers[t].at == At::warp;
    if (!all) continue;
    for (unsigned t = t0; t < t1; ++t) l.fibers[t].at = At::run;
    opened = true;
  }
  if (opened) return true;
  bool all_block = true, all_done = true;
  for (auto& f : l.fibers) {
    all_block = all_block && f.at == At::block;
    all_done = all_done && f.at == At::done;
  }
  if (all_done) return false;
  if (!all_block) {
    std::fprintf(stderr, "cuda_emu: a block's threads wait at barriers that never open\n");
    std::abort();
  }
  for (auto& f : l.fibers) f.at = At::run;
  return true;
}
}
extern "C" void rt_emu_syncthreads() { wait_at(At::block); }
// A warp shuffle: this lane's value from lane + o (o < 0: from lane - |o|), its own where that lane
// is outside the warp.
extern "C" uint64_t rt_emu_shfl(uint64_t bits, int o) {
  Launch* l = rt_launch_now;
  const unsigned t = l->current;
  const int lane = (int)(t % 32), from = lane + o;
  l->slots[t] = bits;
  wait_at(At::warp);
  const uint64_t r = from >= 0 && from < 32 && t + o < l->fibers.size() ? l->slots[t + o] : bits;
  wait_at(At::warp);
  return r;
}
extern "C" unsigned rt_emu_ballot(int p) {
  Launch* l = rt_launch_now;
  const unsigned t = l->current, w0 = t - t % 32;
  l->slots[t] = p != 0;
  wait_at(At::warp);
  unsigned m = 0;
  for (unsigned k = 0; k < 32 && w0 + k < l->fibers.size(); ++k) m |= (unsigned)l->slots[w0 + k] << k;
  wait_at(At::warp);
  return m;
}
extern "C" void rt_emu_syncwarp() { wait_at(At::warp); }
extern "C" void rt_emu_launch(void (*body)(void*), void* args, const unsigned* grid, const unsigned* block) {
  Launch l;
  Launch* outer = rt_launch_now;
  rt_launch_now = &l;
  l.body = body;
  l.args = args;
  const rt_dim3 d{block[0], block[1], block[2]};
  const unsigned n = d.x * d.y * d.z, nwarps = (n + 31) / 32;
  l.fibers.resize(n);
  l.stacks = static_cast<char*>(std::malloc((size_t)n * STACK));
  gridDim = {grid[0], grid[1], grid[2]};
  blockDim = d;
  for (unsigned bz = 0; bz < grid[2]; ++bz)
  for (unsigned by = 0; by < grid[1]; ++by)
  for (unsigned bx = 0; bx < grid[0]; ++bx) {
    blockIdx = {bx, by, bz};
    for (unsigned t = 0; t < n; ++t) {
      Fiber& f = l.fibers[t];
      f.at = At::run;
      f.index = {t % d.x, (t / d.x) % d.y, t / (d.x * d.y)};
      getcontext(&f.context);
      f.context.uc_stack.ss_sp = l.stacks + (size_t)t * STACK;
      f.context.uc_stack.ss_size = STACK;
      f.context.uc_link = &l.scheduler;
      makecontext(&f.context, fiber_entry, 0);
    }
    while (step(l, nwarps)) {}
  }
  std::free(l.stacks);
  rt_launch_now = outer;
}
"""

# What a kernel's unit sees of CUDA: C headers only (the threads' headers took about three
# quarters of a kernel's compile time when each unit included them).
PRELUDE = r"""
#include <cmath>
#include <cstring>
#include <cstdint>
struct rt_dim3 { unsigned x, y, z; };
extern __thread rt_dim3 threadIdx, blockIdx, blockDim, gridDim;
extern "C" void rt_emu_syncthreads();
extern "C" uint64_t rt_emu_shfl(uint64_t bits, int o);
extern "C" void rt_emu_syncwarp();
extern "C" unsigned rt_emu_ballot(int p);
extern "C" void rt_emu_launch(void (*body)(void*), void* args, const unsigned* grid, const unsigned* block);
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __restrict__
#define __shared__ static
#define RT_WARP 32
static inline void __syncthreads() { rt_emu_syncthreads(); }
template <typename T> static T rt_shfl(T v, int o) {
  static_assert(sizeof(T) <= 8);
  uint64_t bits = 0; std::memcpy(&bits, &v, sizeof(T));
  bits = rt_emu_shfl(bits, o);
  T r; std::memcpy(&r, &bits, sizeof(T)); return r;
}
#define RT_SHFL_DOWN(v, o) rt_shfl((v), (int)(o))
#define RT_SHFL_UP(v, o) rt_shfl((v), -(int)(o))
typedef unsigned rt_lanes;
#define RT_POPC(m) __builtin_popcount(m)
#define RT_SYNCWARP() rt_emu_syncwarp()
#define RT_BALLOT(p) rt_emu_ballot((p))
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
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicMax(unsigned* p, unsigned v) { unsigned old = *p; if (v > old) *p = v; return old; }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
// (Blocks run one after another on one thread: a plain read-modify-write is atomic here.)
static inline float atomicAdd(float* p, float v) { float old = *p; *p = old + v; return old; }
static inline double atomicAdd(double* p, double v) { double old = *p; *p = old + v; return old; }
"""

# A kernel's parameters from the launch's arrays: pointers first (the bindings), then 32-bit constants.
LAUNCHER = r"""
template <typename T> struct rt_is_ptr { static constexpr bool value = false; };
template <typename T> struct rt_is_ptr<T*> { static constexpr bool value = true; };
template <typename T> static T rt_arg(void** ptrs, const unsigned* consts, int i, int nptr) {
  if constexpr (rt_is_ptr<T>::value) return (T)ptrs[i];
  else return (T)consts[i - nptr];
}
template <int... I> struct rt_seq {};
template <typename... P>
struct rt_args { void (*kernel)(P...); void** ptrs; const unsigned* consts; };
template <typename... P, int... I>
static void rt_call(const rt_args<P...>& a, rt_seq<I...>) {
  constexpr int nptr = (0 + ... + (rt_is_ptr<P>::value ? 1 : 0));
  a.kernel(rt_arg<P>(a.ptrs, a.consts, I, nptr)...);
}
template <typename... P>
static void rt_launch(void (*k)(P...), void** ptrs, const unsigned* consts,
                      const unsigned* grid, const unsigned* block) {
  rt_args<P...> a{k, ptrs, consts};
  rt_emu_launch([](void* v) {
    rt_call(*static_cast<rt_args<P...>*>(v), rt_seq<__integer_pack((int)sizeof...(P))...>{});
  }, &a, grid, block);
}
"""

_CACHE = Path(os.environ.get("RUNTIME_EMU_CACHE", Path(tempfile.gettempdir()) / "runtime-cuda-emu"))
_FLAGS = ["-std=c++20", "-O1", "-w", "-shared", "-fPIC", "-pthread"]


def _compiled(code: str, prefix: str, extra: list[str]) -> Path:
    """The shared library of ``code`` in the cache (built once; concurrent builders each write their
    own file and the last rename wins)."""
    digest = hashlib.sha256(code.encode()).hexdigest()[:20]
    _CACHE.mkdir(parents=True, exist_ok=True)
    lib = _CACHE / f"{prefix}{digest}.so"
    if not lib.exists():
        cpp = _CACHE / f"{prefix}{digest}.{os.getpid()}.cpp"
        cpp.write_text(code)
        tmp = _CACHE / f"{prefix}{digest}.{os.getpid()}.so"
        subprocess.run([GXX, *_FLAGS, str(cpp), *extra, "-o", str(tmp)], check=True, capture_output=True, text=True)
        os.replace(tmp, lib)
        cpp.unlink()
    return lib


_threads: ctypes.CDLL | None = None


def threads_library() -> Path:
    """The execution model's library, loaded with its symbols global so kernel libraries bind to it."""
    global _threads
    lib = _compiled(THREADS, "threads-", [])
    if _threads is None:
        _threads = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    return lib


def build(src) -> ctypes.CDLL:
    """Compile one KernelSource's CUDA C for the CPU; returns the library with launch_<export> entry points."""
    body = src._cuda_fn()
    launchers = "".join(
        f'extern "C" void launch_{e.name}(void** p, const unsigned* c, const unsigned* g, const unsigned* b)'
        f" {{ rt_launch({e.name}, p, c, g, b); }}\n" for e in src.exports)
    threads = threads_library()
    return ctypes.CDLL(str(_compiled(PRELUDE + COMMON + body + LAUNCHER + launchers, "", [str(threads)])))


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
