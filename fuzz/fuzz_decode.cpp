// libFuzzer target for incremental decoding (nn/sequence_model.h): begin_decode / decode_step of the three built-in
// models (decoder-only "lm", encoder-decoder "seq2seq", encoder-only "encoder"; tiny, random weights) driven by a
// fuzzed script that also misuses the DecodeState the way a caller could: appending any token (out of the
// vocabulary too), any active list (out of range, repeated, unordered), switching the cache off, changing sources,
// rows, cached counts, memory or caches, decoding a state by hand or with another model. Only attograd::Error may
// escape decode_step; a crash, an ASan report, another exception, logits of the wrong shape, or a NaN logit from a
// state whose model-owned fields were left alone is a bug.
//
//   CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DATTOGRAD_FUZZ=ON -DATTOGRAD_BUILD_TESTS=OFF \
//       -DATTOGRAD_BUILD_EXAMPLES=OFF && cmake --build build-fuzz --target fuzz_decode
//   build-fuzz/fuzz_decode -max_total_time=60 fuzz/corpus/decode
//
// Input: byte 0 picks the model (and whether a second one decodes), byte 1 the rows (1..4), then per row a length
// byte (0..7) and its tokens, then operations of two bytes each (opcode, argument) until the input ends (at most 48).

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "autograd/error.h"
#include "autograd/tensor.h"
#include "nn/sequence_model.h"

namespace {

using attograd::Tensor;
using attograd::nn::DecodeState;
using attograd::nn::SequenceModel;
using attograd::nn::TokenRows;

constexpr int64_t kVocab = 12;

std::shared_ptr<SequenceModel> build(const std::string& kind, uint64_t seed) {
  attograd::Generator gen(seed);
  auto m = attograd::nn::make_model(kind,
                                    {.vocab = kVocab,
                                     .layers = 1,
                                     .d_model = 8,
                                     .heads = 2,
                                     .d_ff = 16,
                                     .max_source_len = 8,
                                     .max_target_len = 8,
                                     .aligned = kind == "encoder"},
                                    gen);
  m->eval();
  return m;
}

struct Models {
  std::shared_ptr<SequenceModel> own[3], other[3];
};

const Models& models() {
  static const Models* m = [] {
    auto* p = new Models;
    const char* kinds[3] = {"lm", "seq2seq", "encoder"};
    for (int i = 0; i < 3; ++i) {
      p->own[i] = build(kinds[i], 1);
      p->other[i] = build(kinds[i], 2);
    }
    return p;
  }();
  return *m;
}

struct Reader {
  const uint8_t* data;
  size_t size, pos = 0;
  bool done() const { return pos >= size; }
  uint8_t next() { return pos < size ? data[pos++] : 0; }
};

// A token from a byte: mostly in the vocabulary, sometimes just outside it or far outside.
int64_t token(uint8_t b) {
  if (b < 200) return b % kVocab;
  if (b < 230) return kVocab + (b % 3);
  if (b < 250) return -1 - (b % 3);
  return int64_t{1} << (40 + b % 8);
}

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "fuzz_decode: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in{data, size};
  const uint8_t pick = in.next();
  const Models& ms = models();
  SequenceModel& model = *ms.own[pick % 3];
  SequenceModel& other = *ms.other[pick % 3];
  const int rows = 1 + in.next() % 4;
  TokenRows sources(static_cast<size_t>(rows));
  for (auto& r : sources) {
    const int len = in.next() % 8;
    for (int i = 0; i < len; ++i) r.push_back(in.next() % kVocab);  // begin_decode's callers check the sources
  }
  attograd::NoGradGuard no_grad;
  DecodeState st;
  try {
    st = (pick & 8) ? DecodeState::start(sources) : model.begin_decode(sources);
  } catch (const attograd::Error&) {
    return 0;  // e.g. an empty prompt for the decoder-only model
  }
  bool tampered = (pick & 8) != 0;  // a model-owned field changed: garbage logits are allowed, crashes are not
  for (int op = 0; op < 48 && !in.done(); ++op) {
    const uint8_t code = in.next(), arg = in.next();
    const size_t r = st.decoded.empty() ? 0 : arg % st.decoded.size();
    switch (code % 12) {
      case 0:
      case 1:
      case 2: {  // a step, by this model or (rarely) the other one
        SequenceModel& m = (code % 12 == 2 && (arg & 1)) ? other : model;
        try {
          const Tensor logits = m.decode_step(st);  // (A, V)
          if (logits.dim() != 2 || logits.size(0) != static_cast<int64_t>(st.active.size()) ||
              logits.size(1) != kVocab)
            bug("decode_step returned logits of the wrong shape");
          if (!tampered)
            for (double v : logits.to_vector<double>())
              if (std::isnan(v)) bug("decode_step returned NaN from an untampered state");
          // As greedy decoding: each active row gets its argmax... or here, a token from the script.
          for (int64_t b : st.active)
            if (b >= 0 && static_cast<size_t>(b) < st.decoded.size() && st.decoded[static_cast<size_t>(b)].size() < 40)
              st.decoded[static_cast<size_t>(b)].push_back(arg % kVocab);
        } catch (const attograd::Error&) {
        }
        break;
      }
      case 3:  // append a token to a row
        if (!st.decoded.empty() && st.decoded[r].size() < 40) st.decoded[r].push_back(token(in.next()));
        break;
      case 4: {  // a fuzzed active list
        st.active.clear();
        const int n = arg % 6;
        for (int i = 0; i < n; ++i) {
          const uint8_t b = in.next();
          st.active.push_back(b < 240 ? b % 5 : -1 - b % 3);
        }
        break;
      }
      case 5:
        st.use_cache = !st.use_cache;
        break;
      case 6:  // a cached count
        if (!st.cached.empty()) st.cached[arg % st.cached.size()] = static_cast<int64_t>(arg % 48) - 4;
        tampered = true;
        break;
      case 7:  // change a source
        if (!st.sources.empty()) st.sources[arg % st.sources.size()].push_back(arg % kVocab);
        break;
      case 8:  // rows added or removed
        if (arg & 1) {
          st.sources.push_back({4});
          st.decoded.emplace_back();
          st.cached.push_back(0);
        } else {
          TokenRows& rows_of = arg & 2 ? st.decoded : st.sources;
          if (!rows_of.empty()) rows_of.pop_back();
        }
        break;
      case 9:  // model-owned tensors dropped or swapped
        if (arg & 1) st.memory.clear();
        if (arg & 2) st.cache.clear();
        if ((arg & 4) && st.cache.size() >= 2) std::swap(st.cache.front(), st.cache.back());
        if ((arg & 8) && st.memory.size() >= 2) std::swap(st.memory.front(), st.memory.back());
        tampered = true;
        break;
      case 10: {  // the state of another decode of this model (or the other's) moved in whole or in part
        TokenRows alt(static_cast<size_t>(1 + arg % 4), std::vector<int64_t>{5, 6});
        try {
          DecodeState s2 = (arg & 16 ? other : model).begin_decode(alt);
          if (arg & 32) {
            st = std::move(s2);
            tampered = false;
          } else {
            st.memory = s2.memory;
            st.cache = s2.cache;
            tampered = true;
          }
        } catch (const attograd::Error&) {
        }
        break;
      }
      default:  // truncate a row's tokens
        if (!st.decoded.empty()) st.decoded[r].resize(st.decoded[r].size() / 2);
        break;
    }
  }
  return 0;
}
