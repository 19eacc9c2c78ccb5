#include "autograd/flex.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <utility>

#include "autograd/cpu/kernels.h"

namespace attograd {

Score tanh(const Score& a) {
  const double t = std::tanh(a.v);
  return chain(a, t, 1.0 - t * t);
}
Score exp(const Score& a) {
  const double e = std::exp(a.v);
  return chain(a, e, e);
}
Score log(const Score& a) { return chain(a, std::log(a.v), 1.0 / a.v); }
Score sqrt(const Score& a) {
  const double r = std::sqrt(a.v);
  return chain(a, r, 0.5 / r);
}
Score abs(const Score& a) { return chain(a, std::fabs(a.v), a.v < 0 ? -1.0 : 1.0); }

Captures::Captures(const std::vector<Tensor>& tensors) {
  std::vector<View>& views_ = own_;
  views_.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    ATTO_CHECK(t.defined() && is_floating(t.dtype()), "score_mod", "capture ", i,
               " must be a defined float32 or float64 tensor, got ",
               t.defined() ? dtype_name(t.dtype()) : "undefined", t.defined() ? str_cat(" ", t.shape()) : "");
    views_.push_back({t.const_raw_data(), t.dtype(), t.shape(), static_cast<int32_t>(i)});
  }
  v_ = own_.data();
  n_ = own_.size();
}

Score Captures::View::at(const int64_t* ix, int64_t n) const {
  ATTO_CHECK(n == static_cast<int64_t>(shape.size()), "score_mod", "capture ", id, " of shape ", shape, " read with ",
             n, " indices");
  int64_t flat = 0;
  for (int64_t d = 0; d < n; ++d) {
    ATTO_CHECK(ix[d] >= 0 && ix[d] < shape[d], "score_mod", "capture ", id, " of shape ", shape, ": index ", ix[d],
               " out of range in dimension ", d);
    flat = flat * shape[d] + ix[d];
  }
  Score s;
  s.v = dtype == kFloat64 ? static_cast<const double*>(data)[flat]
                          : static_cast<double>(static_cast<const float*>(data)[flat]);
  s.n = 1;
  s.p[0] = {id, flat, 1.0};
  return s;
}

// ---- block masks

namespace detail {
struct BlockMaskCache {
  std::mutex mu;
  struct Entry {
    int64_t B, H, Lq, Lk, q_offset;
    BlockMask mask;
  };
  std::vector<Entry> entries;  // most recently built last
};
}  // namespace detail

MaskMod::MaskMod(MaskFn fn, bool per_batch, bool per_head)
    : fn_(std::move(fn)), per_batch_(per_batch), per_head_(per_head) {
  if (fn_) cache_ = std::make_shared<detail::BlockMaskCache>();
}

BlockMask MaskMod::block_mask(int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t q_offset) const {
  ATTO_CHECK(fn_, "mask_mod", "no mask function set");
  const int64_t Bm = per_batch_ ? B : 0, Hm = per_head_ ? H : 0;
  std::lock_guard<std::mutex> lock(cache_->mu);
  for (const auto& e : cache_->entries)
    if (e.B == Bm && e.H == Hm && e.Lq == Lq && e.Lk == Lk && e.q_offset == q_offset) return e.mask;
  // A block of 64 rows: the kernel's rows of queries (kBlockRows) never cross one, the per-element test stays short.
  BlockMask m = create_block_mask(*this, Bm, Hm, Lq, Lk, 64, q_offset);
  if (cache_->entries.size() >= 16) cache_->entries.erase(cache_->entries.begin());
  cache_->entries.push_back({Bm, Hm, Lq, Lk, q_offset, m});
  return m;
}

int64_t& detail::block_mask_bits_limit() {
  static int64_t limit = int64_t(256) << 20;
  return limit;
}

BlockMask create_block_mask(const MaskMod& mod, int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t bs,
                            int64_t q_offset) {
  constexpr const char* op = "create_block_mask";
  ATTO_CHECK(static_cast<bool>(mod), op, "mask_mod has no function");
  ATTO_CHECK(B >= 0 && H >= 0 && Lq >= 0 && Lk >= 0 && bs >= 1 && q_offset >= 0, op,
             "B, H (0 = every one), Lq, Lk, q_offset must be >= 0 and block_size >= 1, got B = ", B, ", H = ", H,
             ", Lq = ", Lq, ", Lk = ", Lk, ", block_size = ", bs, ", q_offset = ", q_offset);
  auto d = std::make_shared<BlockMask::Data>();
  d->fn = mod.fn();
  d->B = std::max<int64_t>(B, 1), d->H = std::max<int64_t>(H, 1), d->Lq = Lq, d->Lk = Lk, d->bs = bs;
  d->q_offset = q_offset;
  const int64_t nbq = (Lq + bs - 1) / bs, nbk = (Lk + bs - 1) / bs;
  const size_t nblocks = static_cast<size_t>(d->B * d->H * nbq * nbk);
  d->kinds.assign(nblocks, 0);
  d->bits_at.assign(nblocks, -1);
  const MaskFn& fn = mod.fn();
  const auto kBitsLimit = static_cast<size_t>(std::max<int64_t>(detail::block_mask_bits_limit(), 0));
  std::vector<uint8_t> blk(static_cast<size_t>(bs * bs));
  for (int64_t b = 0; b < d->B; ++b)
    for (int64_t h = 0; h < d->H; ++h)
      for (int64_t qb = 0; qb < nbq; ++qb)
        for (int64_t kb = 0; kb < nbk; ++kb) {
          int64_t seen = 0, total = 0;
          std::fill(blk.begin(), blk.end(), uint8_t(0));
          for (int64_t i = qb * bs; i < std::min(Lq, (qb + 1) * bs); ++i)
            for (int64_t j = kb * bs; j < std::min(Lk, (kb + 1) * bs); ++j, ++total) {
              const bool on = fn(b, h, q_offset + i, j);
              blk[static_cast<size_t>((i - qb * bs) * bs + (j - kb * bs))] = on;
              seen += on;
            }
          const BlockKind k = seen == 0 ? BlockKind::Empty : seen == total ? BlockKind::Full : BlockKind::Partial;
          const size_t id = static_cast<size_t>(((b * d->H + h) * nbq + qb) * nbk + kb);
          d->kinds[id] = static_cast<uint8_t>(k);
          if (k == BlockKind::Partial && d->bits.size() + blk.size() <= kBitsLimit) {
            d->bits_at[id] = static_cast<int64_t>(d->bits.size());
            d->bits.insert(d->bits.end(), blk.begin(), blk.end());
          }
        }
  BlockMask m;
  m.d_ = std::move(d);
  return m;
}

std::array<int64_t, 3> BlockMask::counts() const {
  std::array<int64_t, 3> c = {0, 0, 0};
  for (uint8_t k : d_->kinds) ++c[k];
  return c;
}

Tensor BlockMask::to_dense() const {
  Tensor t = zeros({d_->B, d_->H, d_->Lq, d_->Lk}, {.dtype = kBool});
  bool* out = t.data<bool>();
  for (int64_t b = 0; b < d_->B; ++b)
    for (int64_t h = 0; h < d_->H; ++h)
      for (int64_t i = 0; i < d_->Lq; ++i)
        for (int64_t j = 0; j < d_->Lk; ++j) {
          const BlockKind k = kind(b, h, i / d_->bs, j / d_->bs);
          *out++ = k == BlockKind::Full || (k == BlockKind::Partial && d_->fn(b, h, d_->q_offset + i, j));
        }
  return t;
}

// ---- the kernels' entry points (compiled here once, not per kernel set)

bool cpu::flex_mask(const FlexArgs& f, int64_t b, int64_t h, int64_t i, int64_t j) {
  return (*static_cast<const MaskFn*>(f.mask))(b, h, f.q_offset + i, j);
}

double cpu::flex_score(const FlexArgs& f, double s, int64_t b, int64_t h, int64_t i, int64_t j) {
  Score x;
  x.v = s;
  x.ds = 1.0;
  return (*static_cast<const ScoreFn*>(f.score))(x, b, h, f.q_offset + i, j, *static_cast<const Captures*>(f.captures))
      .v;
}

double cpu::flex_score_backward(const FlexArgs& f, double s, int64_t b, int64_t h, int64_t i, int64_t j, double g,
                                double* cap_grad) {
  Score x;
  x.v = s;
  x.ds = 1.0;
  const Score r =
      (*static_cast<const ScoreFn*>(f.score))(x, b, h, f.q_offset + i, j, *static_cast<const Captures*>(f.captures));
  if (cap_grad)
    for (int t = 0; t < r.n; ++t) cap_grad[f.cap_offset[r.p[t].capture] + r.p[t].index] += g * r.p[t].d;
  return r.ds;
}

// ---- library mods

MaskMod causal_mask() {
  return MaskMod([](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q; });
}

MaskMod sliding_window_mask(int64_t window, bool causal) {
  ATTO_CHECK(window >= 1, "sliding_window_mask", "window must be >= 1, got ", window);
  if (causal) return MaskMod([window](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q && q - kv < window; });
  return MaskMod([window](int64_t, int64_t, int64_t q, int64_t kv) { return std::abs(q - kv) <= window; });
}

MaskMod block_layout_mask(const Tensor& layout, int64_t block_size) {
  ATTO_CHECK(layout.defined() && layout.dtype() == kBool && layout.dim() == 2 && block_size >= 1,
             "block_layout_mask", "layout must be Bool (q_blocks, kv_blocks) and block_size >= 1, got ",
             layout.defined() ? dtype_name(layout.dtype()) : "undefined",
             layout.defined() ? str_cat(" ", layout.shape()) : "", ", block_size = ", block_size);
  const Tensor lay = layout.detach();
  const int64_t nbq = lay.shape()[0], nbk = lay.shape()[1];
  return MaskMod([lay, nbq, nbk, block_size](int64_t, int64_t, int64_t q, int64_t kv) {
    const int64_t r = q / block_size, c = kv / block_size;
    ATTO_CHECK(r < nbq && c < nbk, "block_layout_mask", "position (", q, ", ", kv, ") outside the layout ",
               lay.shape(), " of blocks of ", block_size);
    return static_cast<const bool*>(lay.const_raw_data())[r * nbk + c];
  });
}

MaskMod prefix_lm_mask(int64_t prefix) {
  ATTO_CHECK(prefix >= 0, "prefix_lm_mask", "prefix must be >= 0, got ", prefix);
  return MaskMod([prefix](int64_t, int64_t, int64_t q, int64_t kv) { return kv < prefix || kv <= q; });
}

MaskMod prefix_lm_mask(std::vector<int64_t> prefix) {
  for (int64_t p : prefix) ATTO_CHECK(p >= 0, "prefix_lm_mask", "prefix lengths must be >= 0, got ", p);
  return MaskMod(
      [prefix = std::move(prefix)](int64_t b, int64_t, int64_t q, int64_t kv) {
        ATTO_CHECK(b < static_cast<int64_t>(prefix.size()), "prefix_lm_mask", "batch row ", b, " but ",
                   prefix.size(), " prefix lengths");
        return kv < prefix[static_cast<size_t>(b)] || kv <= q;
      },
      /*per_batch=*/true);
}

MaskMod document_mask(const Tensor& doc_ids, bool causal) {
  ATTO_CHECK(doc_ids.defined() && doc_ids.dtype() == kInt64 && doc_ids.dim() == 2, "document_mask",
             "doc_ids must be Int64 (B, L), got ", doc_ids.defined() ? dtype_name(doc_ids.dtype()) : "undefined",
             doc_ids.defined() ? str_cat(" ", doc_ids.shape()) : "");
  const Tensor ids = doc_ids.detach();
  const int64_t B = ids.shape()[0], L = ids.shape()[1];
  return MaskMod(
      [ids, B, L, causal](int64_t b, int64_t, int64_t q, int64_t kv) {
        ATTO_CHECK(b < B && q < L && kv < L, "document_mask", "position (b = ", b, ", q = ", q, ", kv = ", kv,
                   ") outside doc_ids ", ids.shape());
        const int64_t* d = static_cast<const int64_t*>(ids.const_raw_data()) + b * L;
        return d[q] == d[kv] && (!causal || kv <= q);
      },
      /*per_batch=*/true);
}

MaskMod and_masks(const MaskMod& a, const MaskMod& b) {
  ATTO_CHECK(a && b, "and_masks", "both masks must have a function");
  return MaskMod([fa = a.fn(), fb = b.fn()](int64_t bb, int64_t h, int64_t q, int64_t kv) {
    return fa(bb, h, q, kv) && fb(bb, h, q, kv);
  }, a.per_batch() || b.per_batch(), a.per_head() || b.per_head());
}

MaskMod or_masks(const MaskMod& a, const MaskMod& b) {
  ATTO_CHECK(a && b, "or_masks", "both masks must have a function");
  return MaskMod([fa = a.fn(), fb = b.fn()](int64_t bb, int64_t h, int64_t q, int64_t kv) {
    return fa(bb, h, q, kv) || fb(bb, h, q, kv);
  }, a.per_batch() || b.per_batch(), a.per_head() || b.per_head());
}

Tensor alibi_slopes(int64_t H) {
  ATTO_CHECK(H >= 1, "alibi_slopes", "num_heads must be >= 1, got ", H);
  auto pow2 = [](int64_t n) {  // 2^(-8 (i + 1) / n), i < n
    std::vector<double> s(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) s[static_cast<size_t>(i)] = std::exp2(-8.0 * static_cast<double>(i + 1) / n);
    return s;
  };
  int64_t n = 1;
  while (n * 2 <= H) n *= 2;
  std::vector<double> s = pow2(n);
  if (n < H) {
    const std::vector<double> extra = pow2(2 * n);
    for (int64_t i = 0; static_cast<int64_t>(s.size()) < H; i += 2) s.push_back(extra[static_cast<size_t>(i)]);
  }
  return from_vector(s, {H});
}

ScoreMod alibi(const Tensor& slopes) {
  ATTO_CHECK(slopes.defined() && slopes.dim() == 1 && is_floating(slopes.dtype()), "alibi",
             "slopes must be a float (H) tensor, got ", slopes.defined() ? str_cat(slopes.shape()) : "undefined");
  return {.fn = [](const Score& s, int64_t, int64_t h, int64_t q, int64_t kv,
                   const Captures& c) { return s + c[0](h) * static_cast<double>(kv - q); },
          .captures = {slopes}};
}

ScoreMod alibi(int64_t num_heads) { return alibi(alibi_slopes(num_heads)); }

ScoreMod compose_score_mods(const ScoreMod& first, const ScoreMod& then) {
  if (!first) return then;
  if (!then) return first;
  const size_t na = first.captures.size(), nb = then.captures.size();
  std::vector<Tensor> caps = first.captures;
  caps.insert(caps.end(), then.captures.begin(), then.captures.end());
  return {.fn = [fa = first.fn, fb = then.fn, na, nb](const Score& s, int64_t b, int64_t h, int64_t q, int64_t kv,
                                                      const Captures& c) {
            return fb(fa(s, b, h, q, kv, c.slice(0, na)), b, h, q, kv, c.slice(na, nb));
          },
          .captures = std::move(caps)};
}

ScoreMod softcap(double cap) {
  ATTO_CHECK(cap > 0 && std::isfinite(cap), "softcap", "cap must be positive and finite, got ", cap);
  return {.fn = [cap](const Score& s, int64_t, int64_t, int64_t, int64_t, const Captures&) {
    return tanh(s / cap) * cap;
  }};
}

ScoreMod relative_position_bias(const Tensor& table) {
  ATTO_CHECK(table.defined() && table.dim() == 2 && table.shape()[1] % 2 == 1 && is_floating(table.dtype()),
             "relative_position_bias", "table must be a float (H, 2 D + 1) tensor, got ",
             table.defined() ? str_cat(table.shape()) : "undefined");
  const int64_t D = table.shape()[1] / 2;
  return {.fn = [D](const Score& s, int64_t, int64_t h, int64_t q, int64_t kv,
                    const Captures& c) { return s + c[0](h, std::clamp<int64_t>(kv - q, -D, D) + D); },
          .captures = {table}};
}

}  // namespace attograd
