#include "core/host_dtype.h"

#include <cmath>

namespace moekit::host {

static uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
static float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float bf16_to_float(uint16_t bits) {
  return bits_float(static_cast<uint32_t>(bits) << 16);
}

uint16_t float_to_bf16(float value) {
  uint32_t u = float_bits(value);
  if (std::isnan(value)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  if (exp == 0) {
    float f = std::ldexp(static_cast<float>(man), -24);
    return sign ? -f : f;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13));
  return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t float_to_f16(float value) {
  uint32_t u = float_bits(value);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  float a = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to inf
  if (a < std::ldexp(1.0f, -14)) {
    // subnormal: multiples of 2^-24, round to nearest even
    float q = a * std::ldexp(1.0f, 24);
    float r = std::nearbyint(q);  // default rounding mode: to nearest even
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t ua = float_bits(a);
  uint32_t exp = (ua >> 23) - 127 + 15;
  uint32_t man = ua & 0x7fffff;
  uint32_t h = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return sign | static_cast<uint16_t>(h);
}

float fp8e4m3_to_float(uint8_t b) {
  int sign = b >> 7;
  int exp = (b >> 3) & 0xf;
  int man = b & 0x7;
  float f;
  if (exp == 0xf && man == 0x7) return NAN;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(man), -9);
  } else {
    f = std::ldexp(1.0f + man / 8.0f, exp - 7);
  }
  return sign ? -f : f;
}

uint8_t float_to_fp8e4m3(float value) {
  if (std::isnan(value)) return 0x7f;
  uint8_t sign = std::signbit(value) ? 0x80 : 0;
  float a = std::fabs(value);
  if (a >= 448.0f) return sign | 0x7e;  // saturate
  if (a < std::ldexp(1.0f, -6)) {
    // Subnormals are multiples of 2^-9; nearbyint rounds ties to even (code 8 = 2^-6).
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  int e2 = 0;
  float m = std::frexp(a, &e2);  // a = m * 2^e2, m in [0.5, 1)
  int exp = e2 - 1;              // a = s * 2^exp, s in [1, 2)
  int man = static_cast<int>(std::nearbyint((2.0f * m - 1.0f) * 8.0f));  // ties to even
  if (man == 8) {
    man = 0;
    ++exp;
  }
  int code = ((exp + 7) << 3) | man;
  return sign | static_cast<uint8_t>(code > 0x7e ? 0x7e : code);
}

double load(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kBF16:
      return bf16_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::kF16:
      return f16_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::kF32:
      return static_cast<const float*>(t.data)[i];
    case DType::kI32:
      return static_cast<const int32_t*>(t.data)[i];
    case DType::kFP8E4M3:
      return fp8e4m3_to_float(static_cast<const uint8_t*>(t.data)[i]);
    case DType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(t.data)[i]);
    case DType::kUndefined:
      break;
  }
  return 0.0;
}

void store(const TensorView& t, int64_t i, double value) {
  switch (t.dtype) {
    case DType::kBF16:
      static_cast<uint16_t*>(t.data)[i] = float_to_bf16(static_cast<float>(value));
      break;
    case DType::kF16:
      static_cast<uint16_t*>(t.data)[i] = float_to_f16(static_cast<float>(value));
      break;
    case DType::kF32:
      static_cast<float*>(t.data)[i] = static_cast<float>(value);
      break;
    case DType::kI32:
      static_cast<int32_t*>(t.data)[i] = static_cast<int32_t>(value);
      break;
    case DType::kFP8E4M3:
      static_cast<uint8_t*>(t.data)[i] = float_to_fp8e4m3(static_cast<float>(value));
      break;
    case DType::kI64:
      static_cast<int64_t*>(t.data)[i] = static_cast<int64_t>(value);
      break;
    case DType::kUndefined:
      break;
  }
}

double round_to(DType dtype, double value) {
  float f = static_cast<float>(value);
  switch (dtype) {
    case DType::kBF16:
      return bf16_to_float(float_to_bf16(f));
    case DType::kF16:
      return f16_to_float(float_to_f16(f));
    case DType::kFP8E4M3:
      return fp8e4m3_to_float(float_to_fp8e4m3(f));
    case DType::kF32:
      return f;
    default:
      return value;
  }
}

}  // namespace moekit::host
