// cuda_fp16.h for cuda_on_cpu.h: __half as IEEE binary16 bits, converted through GCC's _Float16 (round to nearest even).
#pragma once
#include <cstdint>
#include <cstring>

struct __half { uint16_t bits; };
struct __half2 { __half x, y; };

inline __half __float2half_rn(float f) {
    const _Float16 h = static_cast<_Float16>(f);
    __half r;
    std::memcpy(&r.bits, &h, 2);
    return r;
}
inline float __half2float(__half h) {
    _Float16 v;
    std::memcpy(&v, &h.bits, 2);
    return static_cast<float>(v);
}
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
