#pragma once
// The project's own seeded generator: PCG32 (O'Neill, XSH-RR) with its own uniform and normal
// samplers, so that the same seed gives the same numbers on every standard library.

#include <cstdint>

namespace attograd {

/// The full state of a Generator; saving and restoring it replays the same stream.
struct GeneratorState {
  uint64_t state = 0;  ///< PCG's LCG state
  uint64_t inc = 0;    ///< PCG's stream increment (always odd)
  bool operator==(const GeneratorState&) const = default;
};

/// A PCG32 random generator. Cheap to copy; copies continue the same stream independently.
class Generator {
 public:
  /// Seeds the generator (stream 0x853c49e6748fea9b, as in PCG's reference).
  explicit Generator(uint64_t seed = 0x5eed);
  /// Re-seeds in place.
  void manual_seed(uint64_t seed);
  /// Next 32 random bits.
  uint32_t next_u32();
  /// Next 64 random bits (two draws).
  uint64_t next_u64();
  /// Uniform double in [0, 1) with 53 random bits.
  double uniform();
  /// Uniform float in [0, 1) with 24 random bits (one draw).
  float uniform_f();
  /// Uniform double in [lo, hi).
  double uniform(double lo, double hi);
  /// Standard normal by Box-Muller; uses two uniforms per value and caches nothing.
  double normal();
  /// Normal with the given mean and standard deviation.
  double normal(double mean, double std);
  /// Uniform integer in [0, n) without modulo bias; n must be > 0.
  uint64_t randint(uint64_t n);
  /// The whole state (see GeneratorState).
  GeneratorState get_state() const { return {state_, inc_}; }
  /// Restores a state previously returned by get_state().
  void set_state(const GeneratorState& s) { state_ = s.state; inc_ = s.inc | 1u; }

 private:
  uint64_t state_ = 0;
  uint64_t inc_ = 0;
};

/// The process-wide default generator used when a function is not given one (like torch's).
Generator& default_generator();
/// Seeds the default generator (torch.manual_seed).
void manual_seed(uint64_t seed);

}  // namespace attograd
