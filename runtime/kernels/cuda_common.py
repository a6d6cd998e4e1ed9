"""C preludes shared by every generated kernel (CUDA via NVRTC, HIP via hiprtc)."""

CUDA_PRELUDE = r"""
#define RT_WARP 32
#define RT_SHFL_DOWN(v, o) __shfl_down_sync(0xffffffffu, (v), (o))
#define RT_SHFL_UP(v, o) __shfl_up_sync(0xffffffffu, (v), (o))
// A warp's lanes as a bit mask (votes), and the barrier of one warp's lanes.
typedef unsigned rt_lanes;
#define RT_POPC(m) __popc(m)
#define RT_BALLOT(p) __ballot_sync(0xffffffffu, (p))
#define RT_SYNCWARP() __syncwarp()
__device__ __forceinline__ float f16_to_f32(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short f32_to_f16(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
// A load of data this kernel reads once (ld.global.cs, evict first), so that a stream larger than
// the L2 does not push out lines other work will read again: sums of 256 MiB on the H100 ran 1-8%
// faster with it (by grid shape). Whole 4, 8 or 16-byte words (a vector of four elements of any dtype).
template <typename T> __device__ __forceinline__ T rt_load_once(const T* p) {
  T v;
  if constexpr (sizeof(T) % 16 == 0) {
    #pragma unroll
    for (int i = 0; i < (int)(sizeof(T) / 16); ++i)
      reinterpret_cast<uint4*>(&v)[i] = __ldcs(reinterpret_cast<const uint4*>(p) + i);
  } else if constexpr (sizeof(T) == 8) {
    *reinterpret_cast<uint2*>(&v) = __ldcs(reinterpret_cast<const uint2*>(p));
  } else if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<unsigned int*>(&v) = __ldcs(reinterpret_cast<const unsigned int*>(p));
  } else {
    v = *p;
  }
  return v;
}
// A load from the L2, past this processor's L1 (which other workgroups' writes do not update): the
// values other workgroups of the running kernel wrote before a __threadfence.
template <typename T> __device__ __forceinline__ T rt_load_l2(const T* p) {
  T v;
  if constexpr (sizeof(T) % 4 == 0) {
    #pragma unroll
    for (int i = 0; i < (int)(sizeof(T) / 4); ++i)
      reinterpret_cast<unsigned int*>(&v)[i] = __ldcg(reinterpret_cast<const unsigned int*>(p) + i);
  } else {
    v = *reinterpret_cast<const volatile T*>(p);
  }
  return v;
}
"""

HIP_PRELUDE = r"""
#ifndef __HIPCC_RTC__  // hiprtc declares the HIP runtime itself (ROCm 5.2 has no such header)
#include <hip/hip_runtime.h>
#endif
#define RT_WARP 64
#define RT_SHFL_DOWN(v, o) __shfl_down((v), (o))
#define RT_SHFL_UP(v, o) __shfl_up((v), (o))
typedef unsigned long long rt_lanes;
#define RT_POPC(m) __popcll(m)
#define RT_BALLOT(p) __ballot(p)
#define RT_SYNCWARP() __builtin_amdgcn_wave_barrier()  // (a wavefront runs in lockstep: a compiler fence)
__device__ __forceinline__ float f16_to_f32(unsigned short h) {
  _Float16 v; __builtin_memcpy(&v, &h, 2); return (float)v;
}
__device__ __forceinline__ unsigned short f32_to_f16(float f) {
  _Float16 v = (_Float16)f; unsigned short h; __builtin_memcpy(&h, &v, 2); return h;
}
template <typename T> __device__ __forceinline__ T rt_load_once(const T* p) { return *p; }
template <typename T> __device__ __forceinline__ T rt_load_l2(const T* p) {
  T v;
  if constexpr (sizeof(T) % 4 == 0) {
    for (int i = 0; i < (int)(sizeof(T) / 4); ++i)
      reinterpret_cast<unsigned int*>(&v)[i] = reinterpret_cast<const volatile unsigned int*>(p)[i];
  } else {
    v = *reinterpret_cast<const volatile T*>(p);
  }
  return v;
}
"""

COMMON = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;
#define RT_DEV __device__ __forceinline__
// The exclusive running sum of v over the workgroup's threads (one value a thread, in thread order;
// blockDim.x a multiple of the warp), and in *total the sum of all: a scan across each warp by
// shuffles, the warps' totals added in order by every thread. wsum: a slot a warp. Every thread calls it.
RT_DEV u32 rt_block_exclusive(u32 v, u32* wsum, u32* total) {
  const u32 t = threadIdx.x, lane = t % RT_WARP, w = t / RT_WARP, warps = blockDim.x / RT_WARP;
  u32 x = v;
  for (u32 o = 1; o < RT_WARP; o <<= 1) {
    const u32 u = RT_SHFL_UP(x, o);
    if (lane >= o) x += u;
  }
  if (lane == RT_WARP - 1) wsum[w] = x;
  __syncthreads();
  u32 before = 0, all = 0;
  for (u32 k = 0; k < warps; ++k) {
    if (k < w) before += wsum[k];
    all += wsum[k];
  }
  __syncthreads();  // (every thread has read wsum before it is written again)
  *total = all;
  return before + x - v;
}
// The lanes of the warp whose v (8 bits) equals this lane's, by a vote on each bit (on an H200 the
// radix sort of 2**24 floats took 974 us so, 1074 us with __match_any_sync; and HIP has no match).
RT_DEV rt_lanes rt_match_any8(u32 v) {
  rt_lanes peers = ~(rt_lanes)0;
  #pragma unroll
  for (u32 k = 0; k < 8u; ++k) {
    const rt_lanes m = RT_BALLOT((v >> k) & 1u);
    peers &= ((v >> k) & 1u) ? m : ~m;
  }
  return peers;
}
RT_DEV float bf16_to_f32(unsigned short h) { return __uint_as_float(((u32)h) << 16); }
// Round to nearest even, a NaN to 0x7fc0. The GPU's conversion where it has one (sm_80 on): the
// integer steps below cost a kernel that rounds every value it keeps (a bfloat16 row program) more
// than its memory traffic (a bfloat16 layer norm over 8192x4096 on an H200: 119 us, 84 us so).
RT_DEV unsigned short f32_to_bf16(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return f != f ? (unsigned short)0x7fc0 : h;
#else
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
#endif
}
// bf16_to_f32(f32_to_bf16(f)): a float as a bfloat16 store and load give it back, in one conversion
// where the GPU has one (the pair's upper half is the float's top half). A NaN stays a NaN of the
// GPU's own payload (a store canonicalizes it, above).
RT_DEV float bf16_round(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(f), "f"(0.0f));
  return __uint_as_float(r);
#else
  return bf16_to_f32(f32_to_bf16(f));
#endif
}
// Four elements moved as one aligned vector load/store.
template <typename T> struct alignas(4 * sizeof(T)) rt_vec4 { T v[4]; };
// N elements moved as one aligned vector load/store (N * sizeof(T) at most 16 bytes).
template <typename T, int N> struct alignas(N * sizeof(T)) rt_vec { T v[N]; };
RT_DEV float rt_fmax(float a, float b) { return (a > b || a != a) ? a : b; }
RT_DEV float rt_fmin(float a, float b) { return (a < b || a != a) ? a : b; }
RT_DEV double rt_fmax(double a, double b) { return (a > b || a != a) ? a : b; }
RT_DEV double rt_fmin(double a, double b) { return (a < b || a != a) ? a : b; }
// Integer power; negative exponents are rejected when the op is built (numpy raises too).
template <typename T> RT_DEV T rt_ipow(T base, T e) {
  T r = 1;
  while (e > 0) { if (e & 1) r *= base; base *= base; e >>= 1; }
  return r;
}
// numpy's floor division and remainder (Python semantics: the remainder takes the divisor's sign).
#define RT_FLOAT_DIVMOD(T, S) \
  RT_DEV T rt_remainder(T a, T b) { \
    if (b == 0) return fmod##S(a, b); \
    T m = fmod##S(a, b); \
    if (m != 0) { if ((b < 0) != (m < 0)) m += b; } else m = copysign##S((T)0, b); \
    return m; \
  } \
  RT_DEV T rt_floordiv(T a, T b) { \
    if (b == 0 || a - a != a - a || b - b != b - b) return a / b; /* a non-finite operand: the array API's \
                                                                     inf // finite = inf, finite // inf = +-0 */ \
    T m = fmod##S(a, b), d = (a - m) / b; \
    if (m != 0 && ((b < 0) != (m < 0))) d -= 1; \
    if (d == 0) return copysign##S((T)0, a / b); \
    T f = floor##S(d); \
    if (d - f > (T)0.5) f += 1; \
    return f; \
  } \
  RT_DEV T rt_logaddexp(T a, T b) { \
    if (a == b) return a + (T)0.69314718055994530942; \
    const T d = a - b; \
    if (d > 0) return a + log1p##S(exp##S(-d)); \
    if (d <= 0) return b + log1p##S(exp##S(d)); \
    return d; \
  }
RT_FLOAT_DIVMOD(float, f)
RT_FLOAT_DIVMOD(double, )
// nextafter in a 16-bit float format (float16: 10 mantissa bits, emin -14; bfloat16: 7 and -126)
// over its values held in float: nextafterf would step a float's last bit, which the store rounds
// away. The spacing at |a| is 2^(max(exponent, emin) - mantissa bits), half that going toward zero
// from a power of two above the subnormals.
RT_DEV float rt_nextafter16(float a, float b, int mant, int emin, float max_finite) {
  if (a != a || b != b) return a + b;
  if (a == b) return b;
  if (a == 0.0f) return copysignf(ldexpf(1.0f, emin - mant), b);
  if (fabsf(a) == __int_as_float(0x7f800000)) return copysignf(max_finite, a);
  int e;
  frexpf(fabsf(a), &e);
  int ea = e - 1 < emin ? emin : e - 1;
  float ulp = ldexpf(1.0f, ea - mant);
  bool away = (b > a) == (a > 0.0f);
  if (!away && fabsf(a) == ldexpf(1.0f, ea) && ea > emin) ulp *= 0.5f;
  // The magnitude steps, the sign stays: the smallest negative subnormal steps to -0, not +0.
  return copysignf(away ? fabsf(a) + ulp : fabsf(a) - ulp, a);
}
// GELU in its tanh form (the GEMM libraries' GELU epilogue), and its derivative times g.
#define RT_GELU(T, S) \
  RT_DEV T rt_gelu(T x) { \
    const T c = (T)0.79788456080286535588, k = (T)0.044715; \
    return (T)0.5 * x * ((T)1 + tanh##S(c * (x + k * x * x * x))); \
  } \
  RT_DEV T rt_gelu_grad(T g, T x) { \
    const T c = (T)0.79788456080286535588, k = (T)0.044715; \
    const T t = tanh##S(c * (x + k * x * x * x)); \
    return g * ((T)0.5 * ((T)1 + t) + (T)0.5 * x * ((T)1 - t * t) * c * ((T)1 + (T)3 * k * x * x)); \
  }
RT_GELU(float, f)
RT_GELU(double, )
template <typename T> RT_DEV T rt_ifloordiv(T a, T b) {
  if (b == 0) return 0;
  if ((T)-1 < (T)0 && b == (T)-1) return (T)(0ull - (u64)a);
  T q = a / b;
  if ((T)-1 < (T)0 && a % b != 0 && ((a < (T)0) != (b < (T)0))) q -= 1;
  return q;
}
template <typename T> RT_DEV T rt_iremainder(T a, T b) {
  if (b == 0 || ((T)-1 < (T)0 && b == (T)-1)) return 0;
  T r = a % b;
  if ((T)-1 < (T)0 && r != 0 && ((r < (T)0) != (b < (T)0))) r += b;
  return r;
}
// Shifts past the width give 0 (or -1 for negative values shifted right), as numpy's do.
template <typename T> RT_DEV T rt_shl(T a, T b) {
  return (b < (T)0 || b >= (T)(8 * sizeof(T))) ? (T)0 : (T)(a << b);
}
template <typename T> RT_DEV T rt_shr(T a, T b) {
  return (b < (T)0 || b >= (T)(8 * sizeof(T))) ? (a < (T)0 ? (T)-1 : (T)0) : (T)(a >> b);
}
// Float -> integer: toward zero, saturating at the type's range, NaN -> 0 (CUDA's cvt.rzi.sat).
#define RT_F2I(name, T, LO, HI) \
  RT_DEV T name(double v) { \
    return v != v ? (T)0 : (v <= (double)(LO) ? (T)(LO) : (v >= (double)(HI) ? (T)(HI) : (T)v)); \
  }
RT_F2I(rt_f2i_i8, signed char, -128, 127)
RT_F2I(rt_f2i_i16, short, -32768, 32767)
RT_F2I(rt_f2i_i32, int, -2147483647 - 1, 2147483647)
RT_F2I(rt_f2i_i64, long long, -9223372036854775807LL - 1, 9223372036854775807LL)
RT_F2I(rt_f2i_u8, unsigned char, 0, 255)
RT_F2I(rt_f2i_u16, unsigned short, 0, 65535)
RT_F2I(rt_f2i_u32, unsigned int, 0, 4294967295u)
RT_F2I(rt_f2i_u64, unsigned long long, 0, 18446744073709551615ull)
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
    return f"({dtype.c_storage})({value})"


def round_expr(dtype, value: str) -> str:
    """C expression of a compute value as a store of dtype and a load give it back (narrow floats
    round; other types are exact)."""
    code = dtype.code
    if code == "bf16":
        return f"bf16_round((float)({value}))"
    if code == "f16":
        return load_expr(dtype, store_expr(dtype, value))
    return value


def float_to_int_expr(dtype, value: str) -> str:
    """C expression converting a float value to integer dtype `dtype` as every driver does
    (toward zero, saturating, NaN -> 0), in dtype's compute type."""
    return f"({dtype.c_compute})rt_f2i_{dtype.code}({value})"


_SATURATING = {"int": "rt_f2i_i32", "long long": "rt_f2i_i64", "unsigned int": "rt_f2i_u32",
               "unsigned long long": "rt_f2i_u64"}


def convert(value: str, src_compute: str, dst_compute: str) -> str:
    if src_compute == dst_compute:
        return value
    if dst_compute == "bool":
        return f"(({value}) != 0)"
    if src_compute in ("float", "double") and dst_compute in _SATURATING:
        return f"{_SATURATING[dst_compute]}({value})"
    return f"({dst_compute})({value})"


def strided_positions(index: str, targets: list, dims: int, indent: str) -> list:
    """C statements placing element ``index`` of a collapsed shape (constants ``s0``.. of ``dims``
    slots, ``ndim`` in use, the last the fastest) in strided operands: for each (variable, start,
    stride prefix) of ``targets``, ``i64 variable = start + sum of coordinate d * (int)<prefix>d``
    (indices, coordinates and strides fit 32 bits: arrays hold under 2**31 elements,
    ``device.MAX_ELEMENTS``). Straight-line code on the constants by name: arrays of them indexed
    by a loop variable were kept in local memory by NVRTC (a broadcast add spent more time there
    than moving its data). The outermost coordinate is what the divisions leave."""
    lines = [f"{indent}u32 rem = {index};"] + [f"{indent}i64 {var} = {start};" for var, start, _ in targets]
    for d in range(dims - 1, 0, -1):
        adds = " ".join(f"{var} += (i64)(int)c_ * (int){prefix}{d};" for var, _, prefix in targets)
        lines.append(f"{indent}if (ndim > {d}u) {{ const u32 q = rem / s{d}; const u32 c_ = rem - q * s{d}; "
                     f"rem = q; {adds} }}")
    adds = " ".join(f"{var} += (i64)(int)rem * (int){prefix}0;" for var, _, prefix in targets)
    return lines + [f"{indent}if (ndim > 0u) {{ {adds} }}"]


def vector_width(dtypes) -> int:
    """Elements a thread of the contiguous elementwise and fused kernels moves as one vector: 4, or 8
    where every array it moves has elements of at most 2 bytes, so that a thread still moves 16
    bytes of each (a bfloat16 gelu of 2**24 elements ran at 2.1 TB/s on an H200 in vectors of 4,
    the float32 one at 3.6: too few bytes in flight)."""
    return 8 if max(d.itemsize for d in dtypes) <= 2 else 4


def unrolled_elements(storage: list, refs: list, position, body) -> list:
    """C statements of a grid-stride loop over n elements taking 4 a thread, a workgroup's width
    apart (each access coalesced), every input's 4 loads issued before any is used (one element a
    thread read unaligned operands at two thirds of PyTorch's speed on an H200: too few loads in
    flight). Input k (of C storage type ``storage[k]``) is read at ``refs[k]`` into ``r<k>[e]``
    after ``position(indent)``, the statements placing element i; ``body(indent)`` then computes
    and stores element i from the ``r<k>[e]``."""
    lines = ["  for (u64 tile = (u64)blockIdx.x * blockDim.x * 4u; tile < n;"
             " tile += (u64)gridDim.x * blockDim.x * 4u) {"]
    lines += [f"    {t} r{k}[4];" for k, t in enumerate(storage)]
    each = ["    #pragma unroll", "    for (int e = 0; e < 4; ++e) {",
            "      const u64 i = tile + (u64)e * blockDim.x + threadIdx.x;", "      if (i < n) {"]
    lines += each + position("        ") + [f"        r{k}[e] = {ref};" for k, ref in enumerate(refs)]
    lines += ["      }", "    }"] + each + body("        ")
    return lines + ["      }", "    }", "  }"]
