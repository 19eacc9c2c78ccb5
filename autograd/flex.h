#pragma once
// Score and mask functions of the fused attention kernel (PyTorch's FlexAttention, torch.nn.attention.flex_attention,
// in C++): AttentionOptions::score_mod rewrites each pre-softmax score, AttentionOptions::mask_mod says which scores
// EXIST. docs/ATTENTION.md ("Score and mask functions") has the semantics, the block mask and the costs.
//
// Conventions (FlexAttention's):
// - mask_mod(b, h, q_idx, kv_idx) -> bool: TRUE = the score EXISTS (is attended). The OPPOSITE of attn_mask's Bool
//   convention (true = blocked) and the same as a block layout's (true = computed).
// - score_mod(score, b, h, q_idx, kv_idx) -> score is applied to score = scale * q . k BEFORE the softmax, before
//   attn_mask is added and before any masking.
// - The mods see ABSOLUTE positions: q_idx = AttentionOptions::mod_q_offset + the query's row, kv_idx = the key's row.
// - b is the batch row; h is the QUERY head (grouped-query attention too).
// Gradients flow through score_mod into q and k and into the tensors it captures (ScoreMod::captures), which the
// engine sees as inputs of the attention op. score_mod is written over Score, a forward-mode scalar that carries
// d/dscore and the partials with respect to the captured elements it read.

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "autograd/error.h"
#include "autograd/tensor.h"

namespace attograd {

/// A partial derivative of a Score with respect to element `index` (flat, row-major) of captured tensor `capture`.
struct ScorePartial {
  int32_t capture = 0;  ///< which ScoreMod::captures entry
  int64_t index = 0;    ///< flat element index in it
  double d = 0.0;       ///< the partial derivative
};

/// The scalar score_mod computes with: a value, its derivative with respect to the incoming score, and its partials
/// with respect to at most kMaxPartials captured elements (forward-mode differentiation). Arithmetic is in double for
/// float32 and float64 inputs alike. Constants convert implicitly (Score(2.0)).
struct Score {
  static constexpr int kMaxPartials = 6;
  double v = 0.0;   ///< the value
  double ds = 0.0;  ///< d value / d score
  int n = 0;        ///< partials in use
  ScorePartial p[kMaxPartials] = {};
  Score() = default;
  /// A constant.
  Score(double value) : v(value) {}  // NOLINT(google-explicit-constructor): constants mix with scores
  /// The value.
  double value() const { return v; }
  /// Adds c * partial (merging a partial of the same element); error past kMaxPartials.
  void add_partial(const ScorePartial& q, double c) {
    for (int i = 0; i < n; ++i)
      if (p[i].capture == q.capture && p[i].index == q.index) {
        p[i].d += c * q.d;
        return;
      }
    ATTO_CHECK(n < kMaxPartials, "score_mod", "a score depends on more than ", kMaxPartials,
               " captured elements (capture ", q.capture, ", element ", q.index, ")");
    p[n++] = {q.capture, q.index, c * q.d};
  }
};

/// A Score of value f(a) whose derivatives are df * a's (the chain rule of a unary function).
inline Score chain(const Score& a, double f, double df) {
  Score r;
  r.v = f;
  r.ds = df * a.ds;
  for (int i = 0; i < a.n; ++i) r.p[r.n++] = {a.p[i].capture, a.p[i].index, df * a.p[i].d};
  return r;
}
/// c_a * a + c_b * b with value `value` (the shared step of the binary operators).
inline Score combine(const Score& a, double ca, const Score& b, double cb, double value) {
  Score r = chain(a, value, ca);
  r.ds += cb * b.ds;
  for (int i = 0; i < b.n; ++i) r.add_partial(b.p[i], cb);
  return r;
}
inline Score operator+(const Score& a, const Score& b) { return combine(a, 1.0, b, 1.0, a.v + b.v); }
inline Score operator-(const Score& a, const Score& b) { return combine(a, 1.0, b, -1.0, a.v - b.v); }
inline Score operator*(const Score& a, const Score& b) { return combine(a, b.v, b, a.v, a.v * b.v); }
inline Score operator/(const Score& a, const Score& b) {
  return combine(a, 1.0 / b.v, b, -a.v / (b.v * b.v), a.v / b.v);
}
inline Score operator-(const Score& a) { return chain(a, -a.v, -1.0); }
inline Score& operator+=(Score& a, const Score& b) { return a = a + b; }
inline Score& operator-=(Score& a, const Score& b) { return a = a - b; }
inline Score& operator*=(Score& a, const Score& b) { return a = a * b; }
inline Score& operator/=(Score& a, const Score& b) { return a = a / b; }
/// tanh, exp, log, sqrt, abs of a Score (with their derivatives).
Score tanh(const Score& a);
Score exp(const Score& a);
Score log(const Score& a);
Score sqrt(const Score& a);
Score abs(const Score& a);
/// cond ? a : b (the derivatives of the branch taken).
inline Score where(bool cond, const Score& a, const Score& b) { return cond ? a : b; }

/// The tensors a ScoreMod captured, as score_mod reads them: c[i](idx...) is element idx of captures[i] (all its
/// dimensions, bounds-checked) as a Score with partial 1 with respect to that element.
class Captures {
 public:
  /// One captured tensor.
  struct View {
    const void* data = nullptr;
    Dtype dtype = kFloat64;
    Shape shape = {};
    int32_t id = 0;
    /// Element idx... (as many indices as dimensions) as a Score.
    template <class... I>
    Score operator()(I... idx) const {
      const int64_t ix[] = {static_cast<int64_t>(idx)..., 0};
      return at(ix, static_cast<int64_t>(sizeof...(I)));
    }
    /// The element at the indices ix[0 .. n) (what operator() calls).
    Score at(const int64_t* ix, int64_t n) const;
  };
  Captures() = default;
  /// Views of `tensors` (float32 or float64, kept alive by the caller).
  explicit Captures(const std::vector<Tensor>& tensors);
  Captures(const Captures& o) { *this = o; }
  Captures& operator=(const Captures& o) {
    own_ = o.own_;
    v_ = o.v_ == o.own_.data() ? own_.data() : o.v_;
    n_ = o.n_;
    return *this;
  }
  /// The i-th captured tensor.
  const View& operator[](size_t i) const {
    ATTO_CHECK(i < n_, "score_mod", "capture ", i, " read, but the ScoreMod captures ", n_, " tensors");
    return v_[i];
  }
  /// Number of captured tensors.
  size_t size() const { return n_; }
  /// Captures [from, from + count) as a view (no copy; valid while this lives): what a composed mod's part reads.
  Captures slice(size_t from, size_t count) const {
    ATTO_CHECK(from + count <= n_, "score_mod", "captures [", from, ", ", from + count, ") of ", n_);
    Captures c;
    c.v_ = v_ + from;
    c.n_ = count;
    return c;
  }

 private:
  std::vector<View> own_;
  const View* v_ = nullptr;
  size_t n_ = 0;
};

/// score_mod's function: (score, b, h, q_idx, kv_idx, captures) -> the new score.
using ScoreFn =
    std::function<Score(const Score& score, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const Captures& c)>;

/// A score function with the tensors it reads (FlexAttention's score_mod and its closure): ScoreMod{.fn = [](const
/// Score& s, int64_t b, int64_t h, int64_t q, int64_t kv, const Captures& c) { return s + c[0](h) * double(kv - q);
/// }, .captures = {slope}}. Captures are float32 or float64 tensors; those that require grad get gradients.
struct ScoreMod {
  ScoreFn fn = {};                  ///< the function (empty = no score_mod)
  std::vector<Tensor> captures = {};  ///< the tensors fn reads through its Captures argument, in order
  /// True when a function is set.
  explicit operator bool() const { return static_cast<bool>(fn); }
};

/// mask_mod's function: (b, h, q_idx, kv_idx) -> TRUE when the score EXISTS (is attended).
using MaskFn = std::function<bool(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx)>;

class BlockMask;
namespace detail {
struct BlockMaskCache;
}

/// A mask function (FlexAttention's mask_mod; TRUE = attended) with a cache of the block masks the kernel built
/// from it (one per shape; copies share it). per_batch / per_head say whether fn depends on b / h: when not, the
/// block mask is built once for all of them (evaluated at b = 0, h = 0); the per-element test inside partial blocks
/// always passes the real b and h.
class MaskMod {
 public:
  MaskMod() = default;
  /// Wraps fn (callable as bool(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx)).
  MaskMod(MaskFn fn, bool per_batch = false, bool per_head = false);  // NOLINT(google-explicit-constructor)
  /// True when a function is set.
  explicit operator bool() const { return static_cast<bool>(fn_); }
  /// The function.
  const MaskFn& fn() const { return fn_; }
  /// Whether the function depends on b / on h.
  bool per_batch() const { return per_batch_; }
  bool per_head() const { return per_head_; }
  /// The block mask of this shape, built on first use and then cached (thread-safe; at most 16 shapes kept).
  BlockMask block_mask(int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t q_offset) const;

 private:
  MaskFn fn_;
  bool per_batch_ = false, per_head_ = false;
  std::shared_ptr<detail::BlockMaskCache> cache_;
};

/// The kind of a (query block, key block) of a BlockMask.
enum class BlockKind : uint8_t { Empty = 0, Partial = 1, Full = 2 };

/// FlexAttention's BlockMask: per (b, h, query block, key block) whether no score exists (skipped), every score
/// exists (no per-element test) or some do (mask_mod evaluated per element). Cheap to copy (shared data).
class BlockMask {
 public:
  BlockMask() = default;
  /// True when built.
  explicit operator bool() const { return static_cast<bool>(d_); }
  int64_t batch() const { return d_->B; }        ///< B of the mask (1 when built for every row)
  int64_t heads() const { return d_->H; }        ///< H of the mask (1 when built for every head)
  int64_t q_len() const { return d_->Lq; }       ///< Lq
  int64_t kv_len() const { return d_->Lk; }      ///< Lk
  int64_t block_size() const { return d_->bs; }  ///< side of the square blocks
  int64_t q_offset() const { return d_->q_offset; }  ///< absolute position of query row 0 that mask_mod saw
  int64_t q_blocks() const { return (d_->Lq + d_->bs - 1) / d_->bs; }   ///< ceil(Lq / block_size)
  int64_t kv_blocks() const { return (d_->Lk + d_->bs - 1) / d_->bs; }  ///< ceil(Lk / block_size)
  /// The kind of block (qb, kb) of (b, h) (b, h taken modulo a broadcast dimension).
  BlockKind kind(int64_t b, int64_t h, int64_t qb, int64_t kb) const {
    return static_cast<BlockKind>(row(b, h, qb)[kb]);
  }
  /// The kinds of query block qb of (b, h): kv_blocks() bytes (BlockKind values).
  const uint8_t* row(int64_t b, int64_t h, int64_t qb) const {
    const int64_t bb = d_->B == 1 ? 0 : b, hh = d_->H == 1 ? 0 : h;
    return d_->kinds.data() + ((bb * d_->H + hh) * q_blocks() + qb) * kv_blocks();
  }
  /// Per block of query block qb of (b, h): where its elements start in partial_bits() (-1 = not kept).
  const int64_t* partial_row(int64_t b, int64_t h, int64_t qb) const {
    const int64_t bb = d_->B == 1 ? 0 : b, hh = d_->H == 1 ? 0 : h;
    return d_->bits_at.data() + ((bb * d_->H + hh) * q_blocks() + qb) * kv_blocks();
  }
  /// The partial blocks' elements (block_size x block_size bytes each, row-major, 1 = attended).
  const uint8_t* partial_bits() const { return d_->bits.data(); }
  /// How many blocks are of each kind (over every b, h): {empty, partial, full}.
  std::array<int64_t, 3> counts() const;
  /// The mask function partial blocks evaluate.
  const MaskFn& mask_fn() const { return d_->fn; }
  /// A dense Bool (B, H, Lq, Lk) of mask_mod (TRUE = attended), for tests and debugging.
  Tensor to_dense() const;

 private:
  struct Data {
    MaskFn fn;  // (not the MaskMod: its cache holds this mask)
    int64_t B = 1, H = 1, Lq = 0, Lk = 0, bs = 128, q_offset = 0;
    std::vector<uint8_t> kinds;  // (B, H, q_blocks, kv_blocks)
    // The partial blocks' elements, evaluated once: block k's bs x bs bytes (1 = attended) from bits[bits_at[k]];
    // -1 = not kept (past the memory limit: mask_mod is then called per element).
    std::vector<int64_t> bits_at;
    std::vector<uint8_t> bits;
  };
  std::shared_ptr<const Data> d_;
  friend BlockMask create_block_mask(const MaskMod&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
};

/// FlexAttention's create_block_mask: evaluates mask_mod over every (b, h, q, kv) (q at absolute position
/// q_offset + row) and classifies each block_size x block_size block as empty, full or partial. The partial blocks'
/// elements are kept (one byte each, up to 256 MiB in all), so that the kernel reads them instead of calling
/// mask_mod; a mask built for every row / head (B = 0 / H = 0) must then not depend on b / h. B = 0 / H = 0 build
/// one mask for every batch row / head (PyTorch's None; mask_mod evaluated at b = 0 / h = 0). Build it once and pass
/// it as AttentionOptions::block_mask; the kernel's rows of queries never cross a block, so block_size also sets
/// their granularity (any size >= 1; 128 is FlexAttention's default).
BlockMask create_block_mask(const MaskMod& mask_mod, int64_t B, int64_t H, int64_t Lq, int64_t Lk,
                            int64_t block_size = 128, int64_t q_offset = 0);

namespace detail {
/// Most bytes of partial-block elements a block mask keeps (default 256 MiB; 0 keeps none: mask_mod is then called
/// per element of the partial blocks). Either way the results are the same.
int64_t& block_mask_bits_limit();
}  // namespace detail

// ---- library mods

/// Causal: kv_idx <= q_idx (equals AttentionOptions::is_causal when q and keys start at position 0).
MaskMod causal_mask();
/// Sliding window as AttentionOptions::window: causal q - window < kv <= q, else |q - kv| <= window.
MaskMod sliding_window_mask(int64_t window, bool causal = true);
/// Block-sparse as AttentionOptions::block_layout (Bool (nbq, nbk), TRUE = computed): layout[q / b, kv / b].
MaskMod block_layout_mask(const Tensor& layout, int64_t block_size);
/// Prefix-LM: bidirectional over the first `prefix` positions, causal after: kv < prefix or kv <= q.
MaskMod prefix_lm_mask(int64_t prefix);
/// Prefix-LM with a prefix length per batch row (prefix[b]).
MaskMod prefix_lm_mask(std::vector<int64_t> prefix);
/// Document masking for packed sequences: doc_ids Int64 (B, L) holds each position's sequence id; q sees kv only
/// within its own sequence (doc[b, q] == doc[b, kv]) and, when causal, kv <= q. Positions must be < L.
MaskMod document_mask(const Tensor& doc_ids, bool causal = true);
/// Both masks (a score exists where both say so); per_batch / per_head as either.
MaskMod and_masks(const MaskMod& a, const MaskMod& b);
/// Either mask.
MaskMod or_masks(const MaskMod& a, const MaskMod& b);

/// ALiBi's fixed head slopes (Press et al. 2022): for H a power of two, 2^(-8 (h + 1) / H); otherwise the slopes of
/// the nearest lower power of two n followed by every other slope of 2n (their reference code). Float64 (H).
Tensor alibi_slopes(int64_t num_heads);
/// ALiBi: score + slopes[h] * (kv_idx - q_idx) (slopes (H), captured: a learned slope if it requires grad).
ScoreMod alibi(const Tensor& slopes);
/// ALiBi with the fixed slopes alibi_slopes(num_heads).
ScoreMod alibi(int64_t num_heads);
/// `then` applied to the result of `first`: then(first(score, ...), ...), captures first's then then's (each part
/// reads its own as c[0], c[1], ...).
ScoreMod compose_score_mods(const ScoreMod& first, const ScoreMod& then);
/// Gemma 2's soft-capping: cap * tanh(score / cap), cap > 0.
ScoreMod softcap(double cap);
/// A learned relative-position bias (T5-like, unbucketed): score + table[h, clamp(kv - q, -D, D) + D] with table
/// (H, 2 D + 1) captured (gradients reach it).
ScoreMod relative_position_bias(const Tensor& table);


}  // namespace attograd
