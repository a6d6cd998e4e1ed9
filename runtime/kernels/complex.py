"""Complex arithmetic for the generated kernels: two C structs and the functions of the elementwise ops.

``rt_c64`` (two floats) and ``rt_c128`` (two doubles) are the storage and compute types of complex64
and complex128: plain structs with the operators the kernels use, written once here for both
precisions and compiled by NVRTC, hiprtc and the CPU emulation without any header
(``cuda::std::complex`` needs libcu++). Every complex kernel's body starts with ``SOURCE``.

Results follow numpy's (multiplication without C99's recovery of infinities, Smith's division,
integer powers by repeated multiplication) and, for the transcendental functions, the special
values of C99 Annex G, as the array API standard states them: ``exp``, ``log``, ``sqrt``,
``expm1``, ``log1p``, the hyperbolic functions and their inverses, and the circular ones through
them (``sin(z) = -i sinh(iz)``, ``asin(z) = -i asinh(iz)``, ...).
"""

from __future__ import annotations

# The functions of one precision: CPX is the struct, REAL its part type, @ the suffix of REAL's math
# functions ("f" for float), BIG a magnitude past which squares overflow (asinh, atanh and log1p use
# asymptotic forms), TANH_BIG where tanh(x) rounds to +-1, EXP_BIG where exp(x) is about to overflow.
_TEMPLATE = r"""
RT_DEV REAL rt_inf_@() { return (REAL)__int_as_float(0x7f800000); }
RT_DEV REAL rt_nan_@() { return (REAL)__int_as_float(0x7fc00000); }
RT_DEV bool rt_isnan_@(REAL x) { return x != x; }
RT_DEV bool rt_isinf_@(REAL x) { return fabs@(x) == rt_inf_@(); }
RT_DEV bool rt_isfin_@(REAL x) { return fabs@(x) < rt_inf_@(); }
RT_DEV CPX operator+(CPX a, CPX b) { return CPX(a.re + b.re, a.im + b.im); }
RT_DEV CPX operator-(CPX a, CPX b) { return CPX(a.re - b.re, a.im - b.im); }
RT_DEV CPX operator-(CPX a) { return CPX(-a.re, -a.im); }
RT_DEV CPX operator*(CPX a, CPX b) { return CPX(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re); }
RT_DEV CPX& operator+=(CPX& a, CPX b) { a.re += b.re; a.im += b.im; return a; }
RT_DEV CPX& operator*=(CPX& a, CPX b) { a = a * b; return a; }
RT_DEV bool operator==(CPX a, CPX b) { return a.re == b.re && a.im == b.im; }
RT_DEV bool operator!=(CPX a, CPX b) { return !(a == b); }
// numpy's division: Smith's method, a zero divisor giving infinities or NaNs part by part.
RT_DEV CPX operator/(CPX a, CPX b) {
  const REAL br = fabs@(b.re), bi = fabs@(b.im);
  if (br >= bi) {
    if (br == 0 && bi == 0) return CPX(a.re / br, a.im / br);
    const REAL rat = b.im / b.re, scl = (REAL)1 / (b.re + b.im * rat);
    return CPX((a.re + a.im * rat) * scl, (a.im - a.re * rat) * scl);
  }
  const REAL rat = b.re / b.im, scl = (REAL)1 / (b.im + b.re * rat);
  return CPX((a.re * rat + a.im) * scl, (a.im * rat - a.re) * scl);
}
RT_DEV CPX& operator/=(CPX& a, CPX b) { a = a / b; return a; }
RT_DEV CPX rt_cshfl_down(CPX v, int o) { return CPX(RT_SHFL_DOWN(v.re, o), RT_SHFL_DOWN(v.im, o)); }
RT_DEV CPX rt_conj(CPX z) { return CPX(z.re, -z.im); }
RT_DEV REAL rt_creal(CPX z) { return z.re; }
RT_DEV REAL rt_cimag(CPX z) { return z.im; }
RT_DEV REAL rt_cabs(CPX z) { return hypot@(z.re, z.im); }
RT_DEV bool rt_cisnan(CPX z) { return rt_isnan_@(z.re) || rt_isnan_@(z.im); }
RT_DEV bool rt_cisinf(CPX z) { return rt_isinf_@(z.re) || rt_isinf_@(z.im); }
RT_DEV bool rt_cisfinite(CPX z) { return rt_isfin_@(z.re) && rt_isfin_@(z.im); }
RT_DEV CPX rt_mul_i(CPX z) { return CPX(-z.im, z.re); }      // i z
RT_DEV CPX rt_mul_negi(CPX z) { return CPX(z.im, -z.re); }   // -i z
// numpy's reciprocal (its own scaling, not 1 / z).
RT_DEV CPX rt_crecip(CPX z) {
  if (fabs@(z.im) <= fabs@(z.re)) {
    const REAL r = z.im / z.re, d = z.re + z.im * r;
    return CPX((REAL)1 / d, -r / d);
  }
  const REAL r = z.re / z.im, d = z.re * r + z.im;
  return CPX(r / d, (REAL)-1 / d);
}
// The array API's sign: z / |z|, 0 for 0, NaN for NaN parts.
RT_DEV CPX rt_csign(CPX z) {
  if (rt_cisnan(z)) return CPX(rt_nan_@(), rt_nan_@());
  if (z.re == 0 && z.im == 0) return CPX((REAL)0, (REAL)0);
  if (rt_cisinf(z)) {
    if (rt_isinf_@(z.re) && rt_isinf_@(z.im)) return CPX(rt_nan_@(), rt_nan_@());
    return rt_isinf_@(z.re) ? CPX(copysign@((REAL)1, z.re), (REAL)0) : CPX((REAL)0, copysign@((REAL)1, z.im));
  }
  const REAL a = hypot@(z.re, z.im);
  return CPX(z.re / a, z.im / a);
}
RT_DEV CPX rt_cexp(CPX z) {
  const REAL x = z.re, y = z.im;
  if (y == 0) return CPX(exp@(x), y);
  if (!rt_isfin_@(y)) {
    if (rt_isinf_@(x)) return x < 0 ? CPX((REAL)0, (REAL)0) : CPX(x, y - y);
  }
  if (x > (REAL)EXP_BIG) {  // exp(x) overflows where exp(x) cos(y) or exp(x) sin(y) may not: two halves
    const REAL h = exp@(x * (REAL)0.5);
    return CPX((h * cos@(y)) * h, (h * sin@(y)) * h);
  }
  const REAL e = exp@(x);
  return CPX(e * cos@(y), e * sin@(y));
}
RT_DEV CPX rt_cexpm1(CPX z) {
  const REAL x = z.re, y = z.im;
  if (y == 0) return CPX(x == 0 ? (REAL)0 : expm1@(x), y);  // the standard: expm1(-0 + 0j) is +0 + 0j
  if (rt_isinf_@(x) && !rt_isfin_@(y)) return x < 0 ? CPX((REAL)-1, (REAL)0) : CPX(x, y - y);
  if (rt_isinf_@(x) && x < 0) return CPX((REAL)-1, copysign@((REAL)0, sin@(y)));
  if (x > (REAL)EXP_BIG) {  // exp(z) - 1, the 1 lost in exp(x)
    const CPX e = rt_cexp(z);
    return CPX(e.re - (REAL)1, e.im);
  }
  const REAL s = sin@(y * (REAL)0.5);
  return CPX(expm1@(x) * cos@(y) - (REAL)2 * s * s, exp@(x) * sin@(y));
}
RT_DEV CPX rt_clog(CPX z) {
  const REAL x = z.re, y = z.im, h = hypot@(x, y);
  REAL r;
  if (h > (REAL)0.5 && h < (REAL)2) {  // |z| near 1: log1p of |z|^2 - 1, formed without cancelling
    const REAL ax = fabs@(x), ay = fabs@(y), hi = ax > ay ? ax : ay, lo = ax > ay ? ay : ax;
    r = (REAL)0.5 * log1p@((hi - (REAL)1) * (hi + (REAL)1) + lo * lo);
  } else {
    r = log@(h);
  }
  return CPX(r, atan2@(y, x));
}
RT_DEV CPX rt_cscale(CPX z, REAL k) { return CPX(z.re * k, z.im * k); }
RT_DEV CPX rt_clog2(CPX z) { return rt_cscale(rt_clog(z), (REAL)1.44269504088896340736); }
RT_DEV CPX rt_clog10(CPX z) { return rt_cscale(rt_clog(z), (REAL)0.43429448190325182765); }
RT_DEV CPX rt_cround(CPX z) { return CPX(rint@(z.re), rint@(z.im)); }
RT_DEV CPX rt_clog1p(CPX z) {
  const REAL x = z.re, y = z.im;
  if (!(fabs@(x) < (REAL)BIG && fabs@(y) < (REAL)BIG)) return CPX(log@(hypot@(x + (REAL)1, y)), atan2@(y, x + (REAL)1));
  if (fabs@(x) < (REAL)0.5 && fabs@(y) < (REAL)0.5)  // |1 + z|^2 - 1 = x (2 + x) + y^2 without cancelling
    return CPX((REAL)0.5 * log1p@(x * ((REAL)2 + x) + y * y), atan2@(y, x + (REAL)1));
  return CPX(rt_clog(CPX(x + (REAL)1, y)).re, atan2@(y, x + (REAL)1));  // (1 + x exact near x = -1)
}
RT_DEV CPX rt_csqrt(CPX z) {
  const REAL x = z.re, y = z.im;
  if (x == 0 && y == 0) return CPX((REAL)0, y);
  if (rt_isinf_@(y)) return CPX(rt_inf_@(), y);
  if (rt_isnan_@(x)) return CPX(x, x);
  if (rt_isinf_@(x)) {
    if (x > 0) return CPX(x, rt_isnan_@(y) ? y : copysign@((REAL)0, y));
    return CPX(rt_isnan_@(y) ? y : (REAL)0, copysign@(rt_inf_@(), y));
  }
  if (rt_isnan_@(y)) return CPX(y, y);
  // |x| + |z| computed with both scaled down by 4 where they could overflow
  const bool scale = fabs@(x) > (REAL)BIG || fabs@(y) > (REAL)BIG;
  const REAL sx = scale ? x * (REAL)0.25 : x, sy = scale ? y * (REAL)0.25 : y;
  REAL t = sqrt@((fabs@(sx) + hypot@(sx, sy)) * (REAL)0.5);
  if (scale) t *= (REAL)2;
  if (x >= 0) return CPX(t, y / (t * (REAL)2));
  return CPX(fabs@(y) / (t * (REAL)2), copysign@(t, y));
}
RT_DEV CPX rt_cpow(CPX a, CPX b) {
  if (b.re == 0 && b.im == 0) return CPX((REAL)1, (REAL)0);
  if (a.re == 0 && a.im == 0) {  // numpy: 0 for a positive real part (exp(b log 0) is 0 then)
    if (b.re > 0) return CPX((REAL)0, (REAL)0);
    return CPX(rt_nan_@(), rt_nan_@());
  }
  if (b.im == 0 && b.re == trunc@(b.re) && fabs@(b.re) < (REAL)100) {  // numpy: repeated multiplication
    int n = (int)b.re;
    if (n == 1) return a;
    if (n == 2) return a * a;
    if (n == 3) return a * a * a;
    const bool neg = n < 0;
    if (neg) n = -n;
    CPX r((REAL)1, (REAL)0), p = a;
    int mask = 1;
    while (true) {
      if (n & mask) r = r * p;
      mask <<= 1;
      if (n < mask || mask <= 0) break;
      p = p * p;
    }
    return neg ? CPX((REAL)1, (REAL)0) / r : r;
  }
  return rt_cexp(b * rt_clog(a));
}
RT_DEV CPX rt_csinh(CPX z) {
  const REAL x = z.re, y = z.im;
  if (y == 0) return CPX(sinh@(x), y);
  if (x == 0) return CPX(x, rt_isfin_@(y) ? sin@(y) : y - y);
  if (rt_isinf_@(x) && !rt_isfin_@(y)) return CPX(x, y - y);
  if (fabs@(x) > (REAL)EXP_BIG && rt_isfin_@(x)) {  // sinh(x), cosh(x) = +-exp(|x|) / 2 overflow first
    const REAL h = exp@(fabs@(x) * (REAL)0.5), g = h * (REAL)0.5;
    return CPX(copysign@((REAL)1, x) * ((g * cos@(y)) * h), (g * sin@(y)) * h);
  }
  return CPX(sinh@(x) * cos@(y), cosh@(x) * sin@(y));
}
RT_DEV CPX rt_ccosh(CPX z) {
  const REAL x = z.re, y = z.im;
  if (y == 0) return CPX(cosh@(x), copysign@((REAL)0, x) * y);
  if (x == 0) return CPX(rt_isfin_@(y) ? cos@(y) : y - y, rt_isfin_@(y) ? x * sin@(y) : (REAL)0);
  if (rt_isinf_@(x) && !rt_isfin_@(y)) return CPX(fabs@(x), y - y);
  if (fabs@(x) > (REAL)EXP_BIG && rt_isfin_@(x)) {
    const REAL h = exp@(fabs@(x) * (REAL)0.5), g = h * (REAL)0.5;
    return CPX((g * cos@(y)) * h, copysign@((REAL)1, x) * ((g * sin@(y)) * h));
  }
  return CPX(cosh@(x) * cos@(y), sinh@(x) * sin@(y));
}
RT_DEV CPX rt_ctanh(CPX z) {
  const REAL x = z.re, y = z.im;
  if (!rt_isfin_@(x)) {
    if (rt_isnan_@(x)) return CPX(x, y == 0 ? y : x);
    return CPX(copysign@((REAL)1, x), copysign@((REAL)0, y));  // (the array API's zero: C99's has sin(2y)'s sign)
  }
  if (!rt_isfin_@(y)) return CPX(x == 0 ? x : y - y, y - y);
  if (fabs@(x) >= (REAL)TANH_BIG) {  // tanh(x) is +-1 to the last bit; the imaginary part decays as exp(-2|x|)
    const REAL e = exp@((REAL)-2 * fabs@(x));
    return CPX(copysign@((REAL)1, x), (REAL)4 * sin@(y) * cos@(y) * e);
  }
  const REAL t = tan@(y), beta = (REAL)1 + t * t, s = sinh@(x), rho = sqrt@((REAL)1 + s * s);
  const REAL den = (REAL)1 + beta * s * s;
  return CPX(beta * rho * s / den, t / den);
}
RT_DEV CPX rt_csin(CPX z) { return rt_mul_negi(rt_csinh(rt_mul_i(z))); }
RT_DEV CPX rt_ccos(CPX z) { return rt_ccosh(rt_mul_i(z)); }
RT_DEV CPX rt_ctan(CPX z) { return rt_mul_negi(rt_ctanh(rt_mul_i(z))); }
// Kahan's asin of a finite z ("Branch cuts for complex elementary functions", 1987): from sqrt(1 - z)
// and sqrt(1 + z), accurate near the branch points +-1 where 1 - z^2 would cancel (-z.im keeps the
// sign of a zero imaginary part: the side of the cut).
RT_DEV CPX rt_casin_kahan(CPX z) {
  const CPX s1 = rt_csqrt(CPX((REAL)1 - z.re, -z.im)), s2 = rt_csqrt(CPX((REAL)1 + z.re, z.im));
  return CPX(atan2@(z.re, s1.re * s2.re - s1.im * s2.im), asinh@(s1.re * s2.im - s1.im * s2.re));
}
RT_DEV CPX rt_casinh(CPX z) {
  const REAL x = z.re, y = z.im;
  if (rt_isnan_@(x)) {
    if (y == 0) return CPX(x, y);
    return rt_isinf_@(y) ? CPX(rt_inf_@(), x) : CPX(x, x);
  }
  if (rt_isnan_@(y)) return rt_isinf_@(x) ? CPX(x, y) : CPX(y, y);
  if (rt_isinf_@(x)) return CPX(x, rt_isinf_@(y) ? copysign@((REAL)0.78539816339744830962, y) : copysign@((REAL)0, y));
  if (rt_isinf_@(y)) return CPX(copysign@(rt_inf_@(), x), copysign@((REAL)1.57079632679489661923, y));
  if (fabs@(x) > (REAL)BIG || fabs@(y) > (REAL)BIG) {  // asinh(w) = log(2w) + O(1 / w^2), for w = |x| + iy
    CPX r = rt_clog(CPX(fabs@(x), y));
    return CPX(copysign@(r.re + (REAL)0.69314718055994530942, x), r.im);
  }
  return rt_mul_i(rt_casin_kahan(rt_mul_negi(z)));  // asinh(z) = i asin(-iz)
}
RT_DEV CPX rt_casin(CPX z) { return rt_mul_negi(rt_casinh(rt_mul_i(z))); }
RT_DEV CPX rt_cacos(CPX z) {
  if (rt_cisfinite(z) && fabs@(z.re) <= (REAL)BIG && fabs@(z.im) <= (REAL)BIG) {  // Kahan's acos
    const CPX s1 = rt_csqrt(CPX((REAL)1 - z.re, -z.im)), s2 = rt_csqrt(CPX((REAL)1 + z.re, z.im));
    return CPX((REAL)2 * atan2@(s1.re, s2.re), asinh@(s2.re * s1.im - s2.im * s1.re));
  }
  const CPX s = rt_casin(z);
  return CPX((REAL)1.57079632679489661923 - s.re, -s.im);
}
RT_DEV CPX rt_cacosh(CPX z) {
  const CPX w = rt_cacos(z);
  if (rt_isnan_@(w.re) && rt_isnan_@(w.im)) return CPX(w.im, w.re);
  if (rt_isnan_@(w.re)) return CPX(fabs@(w.im), w.re);
  if (rt_isnan_@(w.im)) return z.re == 0 ? CPX(w.im, w.re) : CPX(w.im, w.im);  // the standard: NaN + i pi/2 at 0
  return CPX(fabs@(w.im), copysign@(w.re, z.im));
}
RT_DEV CPX rt_catanh(CPX z) {
  const REAL x = z.re, y = z.im;
  if (rt_isnan_@(x) || rt_isnan_@(y)) {
    if (rt_isinf_@(x)) return CPX(copysign@((REAL)0, x), y);
    if (rt_isinf_@(y)) return CPX(copysign@((REAL)0, x), copysign@((REAL)1.57079632679489661923, y));
    if (x == 0 && rt_isnan_@(y)) return CPX(x, y);
    return CPX(rt_nan_@(), rt_nan_@());
  }
  if (rt_isinf_@(x) || rt_isinf_@(y)) return CPX(copysign@((REAL)0, x), copysign@((REAL)1.57079632679489661923, y));
  const REAL ax = fabs@(x);
  if (ax > (REAL)BIG || fabs@(y) > (REAL)BIG) {  // atanh(z) = 1/z + i pi/2 sign(y) + O(1 / z^3)
    const REAL h = hypot@(x, y);
    return CPX(copysign@((ax / h) / h, x), copysign@((REAL)1.57079632679489661923, y));
  }
  const REAL one_m = (REAL)1 - ax;
  const REAL re = (REAL)0.25 * log1p@((REAL)4 * ax / (one_m * one_m + y * y));
  const REAL im = (REAL)0.5 * atan2@((REAL)2 * y, one_m * ((REAL)1 + ax) - y * y);
  return CPX(copysign@(re, x), im);
}
RT_DEV CPX rt_catan(CPX z) { return rt_mul_negi(rt_catanh(rt_mul_i(z))); }
"""

_STRUCTS = r"""
struct rt_c64;
struct rt_c128 {
  double re, im;
  rt_c128() = default;
  __device__ rt_c128(double r, double i = 0.0) : re(r), im(i) {}
  __device__ inline rt_c128(const rt_c64& z);
};
struct rt_c64 {
  float re, im;
  rt_c64() = default;
  __device__ rt_c64(float r, float i = 0.0f) : re(r), im(i) {}
  __device__ explicit rt_c64(const rt_c128& z) : re((float)z.re), im((float)z.im) {}
};
__device__ inline rt_c128::rt_c128(const rt_c64& z) : re(z.re), im(z.im) {}
"""


def _instance(cpx: str, real: str, suffix: str, big: str, tanh_big: str, exp_big: str) -> str:
    return (_TEMPLATE.replace("TANH_BIG", tanh_big).replace("EXP_BIG", exp_big).replace("BIG", big)
            .replace("CPX", cpx).replace("REAL", real).replace("@", suffix))


#: C source of both complex types and their functions (the body of every kernel on complex data starts with it).
SOURCE = (_STRUCTS + _instance("rt_c64", "float", "f", "1e18", "9", "88")
          + _instance("rt_c128", "double", "", "1e150", "22", "709"))


def shfl_down(dtype, value: str, offset: str) -> str:
    """C expression shuffling `value` (of dtype's compute type) down by `offset` lanes of a warp."""
    if dtype.is_complex:
        return f"rt_cshfl_down({value}, {offset})"
    return f"RT_SHFL_DOWN({value}, {offset})"


def needs_source(*dtypes) -> bool:
    return any(d.is_complex for d in dtypes)
