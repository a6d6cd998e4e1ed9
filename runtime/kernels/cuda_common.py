"""C preludes shared by every generated kernel (CUDA via NVRTC, HIP via hiprtc)."""

CUDA_PRELUDE = r"""
#define RT_WARP 32
#define RT_SHFL_DOWN(v, o) __shfl_down_sync(0xffffffffu, (v), (o))
__device__ __forceinline__ float f16_to_f32(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short f32_to_f16(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
"""

HIP_PRELUDE = r"""
#include <hip/hip_runtime.h>
#define RT_WARP 64
#define RT_SHFL_DOWN(v, o) __shfl_down((v), (o))
__device__ __forceinline__ float f16_to_f32(unsigned short h) {
  _Float16 v; __builtin_memcpy(&v, &h, 2); return (float)v;
}
__device__ __forceinline__ unsigned short f32_to_f16(float f) {
  _Float16 v = (_Float16)f; unsigned short h; __builtin_memcpy(&h, &v, 2); return h;
}
"""

COMMON = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;
#define RT_DEV __device__ __forceinline__
RT_DEV float bf16_to_f32(unsigned short h) { return __uint_as_float(((u32)h) << 16); }
RT_DEV unsigned short f32_to_bf16(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
// Four elements moved as one aligned vector load/store.
template <typename T> struct alignas(4 * sizeof(T)) rt_vec4 { T v[4]; };
RT_DEV float rt_fmax(float a, float b) { return (a > b || a != a) ? a : b; }
RT_DEV float rt_fmin(float a, float b) { return (a < b || a != a) ? a : b; }
RT_DEV int rt_ipow(int base, int e) {
  if (e < 0) return base == 1 ? 1 : (base == -1 ? ((e & 1) ? -1 : 1) : 0);
  int r = 1;
  while (e) { if (e & 1) r *= base; base *= base; e >>= 1; }
  return r;
}
"""


def load_expr(dtype, ref: str) -> str:
    """C expression loading `ref` (an lvalue of dtype's storage) as dtype's compute type."""
    code = dtype.code
    if code == "f16":
        return f"f16_to_f32({ref})"
    if code == "bf16":
        return f"bf16_to_f32({ref})"
    if code == "b8":
        return f"({ref} != 0)"
    return ref


def store_expr(dtype, value: str) -> str:
    """C expression turning a compute value into dtype's storage."""
    code = dtype.code
    if code == "f16":
        return f"f32_to_f16((float)({value}))"
    if code == "bf16":
        return f"f32_to_bf16((float)({value}))"
    if code == "b8":
        return f"(unsigned char)(({value}) != 0)"
    if code == "i32":
        return f"(int)({value})"
    return f"(float)({value})"


def convert(value: str, src_compute: str, dst_compute: str) -> str:
    if src_compute == dst_compute:
        return value
    if dst_compute == "bool":
        return f"(({value}) != 0)"
    return f"({dst_compute})({value})"
