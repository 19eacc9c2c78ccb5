#include "autograd/random.h"

#include <cmath>

namespace attograd {

Generator::Generator(uint64_t seed) { manual_seed(seed); }

void Generator::manual_seed(uint64_t seed) {
  // PCG32 srandom_r with the reference stream.
  inc_ = (0xda3e39cb94b95bdbULL << 1u) | 1u;
  state_ = 0;
  next_u32();
  state_ += seed;
  next_u32();
}

uint32_t Generator::next_u32() {
  uint64_t old = state_;
  state_ = old * 6364136223846793005ULL + inc_;
  auto xorshifted = static_cast<uint32_t>(((old >> 18u) ^ old) >> 27u);
  auto rot = static_cast<uint32_t>(old >> 59u);
  return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
}

uint64_t Generator::next_u64() {
  uint64_t hi = next_u32();
  return (hi << 32) | next_u32();
}

double Generator::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

float Generator::uniform_f() { return static_cast<float>(next_u32() >> 8) * 0x1.0p-24f; }

double Generator::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

double Generator::normal() {
  // Box-Muller; u1 in (0, 1] so the log is finite.
  double u1 = 1.0 - uniform();
  double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

double Generator::normal(double mean, double std) { return mean + std * normal(); }

uint64_t Generator::randint(uint64_t n) {
  // Lemire's rejection: unbiased.
  uint64_t threshold = (0 - n) % n;
  for (;;) {
    uint64_t r = next_u64();
    if (r >= threshold) return r % n;
  }
}

Generator& default_generator() {
  static Generator g(0x5eed);
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace attograd
