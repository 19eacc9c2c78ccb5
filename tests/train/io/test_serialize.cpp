// Native weights files and checkpoints (train/io/serialize.h): round trips, module loading, strict and non-strict
// reports, dtype conversion, checksums, atomic saves under injected faults, checkpoints and inspect().

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "autograd/reduce.h"
#include "nn/attention.h"
#include "nn/feedforward.h"
#include "nn/layers.h"
#include "nn/positional.h"
#include "nn/seed/attention.h"
#include "testing.h"
#include "train/io/files.h"
#include "train/optim/optimizers.h"
#include "train/io/safetensors.h"
#include "train/io/serialize.h"
#include "train/tools/report.h"

using namespace attograd;
using namespace attograd::testing;
namespace io = attograd::io;
namespace fs = std::filesystem;

namespace {

::testing::AssertionResult same_state(const nn::Module& a, const nn::Module& b) {
  auto sa = io::state_dict(a), sb = io::state_dict(b);
  if (sa.size() != sb.size()) return ::testing::AssertionFailure() << sa.size() << " vs " << sb.size() << " tensors";
  for (size_t i = 0; i < sa.size(); ++i) {
    if (sa[i].first != sb[i].first) return ::testing::AssertionFailure() << sa[i].first << " vs " << sb[i].first;
    auto r = bitwise_equal(sa[i].second, sb[i].second);
    if (!r) return r << " in " << sa[i].first;
  }
  return ::testing::AssertionSuccess();
}

float f32_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
double f64_bits(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

// A module holding parameters of given names and shapes, filled with `value`.
struct Bag : nn::Module {
  Bag(const std::vector<std::pair<std::string, Shape>>& params, double value, Dtype dtype = kFloat32) {
    for (auto& [n, s] : params) register_parameter(n, full(s, value, {.dtype = dtype}));
  }
  std::string type_name() const override { return "Bag"; }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Checksum

TEST(Xxh64, KnownVectors) {
  using io::detail::xxh64;
  // The reference implementation's published values.
  EXPECT_EQ(xxh64("", 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(xxh64("a", 1), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(xxh64("abc", 3), 0x44BC2CF5AD770999ULL);
  // Longer inputs (the 32-byte stripe path); the low 32 bits agree with zstd's frame checksums of the same bytes.
  std::string s;
  for (int i = 0; i < 1000; ++i) s += static_cast<char>('a' + i % 26);
  EXPECT_EQ(xxh64(s.data(), 33), 0x9ac581034b031f72ULL);
  EXPECT_EQ(xxh64(s.data(), 100), 0x79c9fa152bb53c71ULL);
  EXPECT_EQ(xxh64(s.data(), 1000), 0x94b86db9a16d86a9ULL);
}

// ---------------------------------------------------------------------------------------------
// Raw tensors

TEST(Serialize, RoundTripIsBitwiseForEveryDtype) {
  TempDir dir("serialize");
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  Tensor f32 = from_vector<float>({qnan, f32_bits(0xffc12345u), f32_bits(0x7f800001u), INFINITY, -INFINITY, -0.0f,
                                   1e-45f, std::numeric_limits<float>::max(), 1.0f / 3.0f},
                                  {3, 3});
  Tensor f64 = from_vector<double>(
      {std::numeric_limits<double>::quiet_NaN(), f64_bits(0xfff0000000000abcULL), -0.0, 4.9e-324, 1.0 / 3.0, -1e308},
      {2, 1, 3});
  Tensor i64 =
      from_vector<int64_t>({std::numeric_limits<int64_t>::min(), -1, 0, std::numeric_limits<int64_t>::max()}, {4});
  Tensor b = from_vector<bool>({true, false, false, true}, {2, 2});
  Tensor scalar = scalar_tensor(2.5, {.dtype = kFloat64});
  Tensor empty_t = zeros({0, 3});
  Tensor rank8 = arange(16, {.dtype = kFloat32});
  rank8 = from_vector<float>(rank8.to_vector<float>(), {1, 2, 1, 1, 2, 1, 2, 2});
  io::NamedTensors in = {{"f32", f32},       {"f64", f64},       {"i64", i64},         {"b", b},
                         {"scalar", scalar}, {"empty", empty_t}, {"deep.rank8", rank8}};
  const std::string meta = R"({"d_model": 8, "name": "t\u00e9st", "layers": [1, 2]})";
  io::write_tensors(dir.file("t.atto"), in, meta);

  std::string meta_back;
  io::NamedTensors out = io::read_tensors(dir.file("t.atto"), &meta_back);
  EXPECT_EQ(meta_back, meta);
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].first, in[i].first);
    EXPECT_TRUE(bitwise_equal(out[i].second, in[i].second)) << in[i].first;
  }
  EXPECT_TRUE(std::isnan(out[0].second.flat(0)));
  EXPECT_EQ(out[4].second.dim(), 0);
  EXPECT_EQ(out[5].second.shape(), (Shape{0, 3}));
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"t.atto"}));
}

TEST(Serialize, NonFiniteWeightsAreRefusedByEveryLoaderUnlessAllowed) {
  // Issue 27: a weights file holding NaN loaded, evaluated with loss NaN and exit 0, and generated <pad> ... Every
  // loader of a model's or a run's state refuses a float tensor with NaN or +-inf, naming the file and the tensor;
  // ReadOptions opts in; inspect() counts them; the tensor-container readers return them as they are.
  TempDir dir("serialize");
  for (Dtype dtype : {kFloat32, kFloat64}) {
    for (double bad : {std::numeric_limits<double>::quiet_NaN(), double{INFINITY}, -double{INFINITY}}) {
      SCOPED_TRACE(dtype_name(dtype) + " " + std::to_string(bad));
      Bag m({{"a", {2, 3}}, {"b", {4}}}, 0.5, dtype);
      Tensor w = m.named_parameters()[1].second;
      if (dtype == kFloat32) {
        w.data<float>()[2] = static_cast<float>(bad);
        w.data<float>()[3] = static_cast<float>(bad);
      } else {
        w.data<double>()[2] = bad;
        w.data<double>()[3] = bad;
      }
      const std::string weights = dir.file("w"), st = dir.file("w.safetensors"), ck = dir.file("ck");
      io::save(m, weights);
      io::export_safetensors(m, st);
      io::Checkpoint c;
      io::add_module_state(c, m);
      io::save_checkpoint(c, ck);
      const std::string want = "tensor 'b' holds 2 non-finite values (the first, ";
      Bag into({{"a", {2, 3}}, {"b", {4}}}, 0.0, dtype);
      EXPECT_ATTO_ERROR(io::load(into, weights), "load: '" + weights + "': " + want);
      EXPECT_EQ(into.named_parameters()[0].second.flat(0), 0.0);  // nothing was copied
      EXPECT_ATTO_ERROR(io::load_checkpoint(ck), "tensor 'model.b' holds 2 non-finite values");
      EXPECT_ATTO_ERROR(io::import_safetensors(into, st), "import_safetensors: '" + st + "': " + want);
      const std::vector<uint8_t> bytes = read_bytes(ck);
      EXPECT_ATTO_ERROR(io::parse_checkpoint_from_memory(bytes.data(), bytes.size()), "'model.b' holds 2 non-finite");
      // Opted in, every loader gives the values back as saved; the container readers always do.
      const io::ReadOptions allow{.allow_nonfinite = true};
      io::load(into, weights, true, allow);
      EXPECT_TRUE(bitwise_equal(into.named_parameters()[1].second, w));
      EXPECT_TRUE(bitwise_equal(io::load_checkpoint(ck, allow).tensor("model.b"), w));
      EXPECT_TRUE(bitwise_equal(io::read_tensors(weights)[1].second, w));
      EXPECT_TRUE(bitwise_equal(io::read_safetensors(st).tensors[1].second, w));
      Bag imported({{"a", {2, 3}}, {"b", {4}}}, 0.0, dtype);
      io::import_safetensors(imported, st, true, {}, allow);
      EXPECT_TRUE(bitwise_equal(imported.named_parameters()[1].second, w));
      // inspect() lists and counts them, for every kind of file.
      for (const std::string& f : {weights, st, ck}) {
        const io::FileInfo info = io::inspect(f);
        int64_t total = 0;
        for (const io::TensorInfo& t : info.tensors) total += t.nonfinite;
        EXPECT_EQ(total, 2) << f;
        EXPECT_NE(info.to_string().find("2 non-finite"), std::string::npos) << info.to_string();
      }
    }
  }
  // Finite extremes, subnormals, -0 and integer tensors whose bits look like a NaN's exponent are fine.
  io::write_tensors(dir.file("ok"),
                    {{"f", from_vector<float>({std::numeric_limits<float>::max(), -0.0f, 1e-45f}, {3})},
                     {"d", from_vector<double>({-1e308, 4.9e-324}, {2})},
                     {"i", from_vector<int64_t>({-1, 0x7ff0000000000000LL}, {2})}});
  Bag ok({{"f", {3}}, {"d", {2}}}, 0.0);
  io::load(ok, dir.file("ok"), /*strict=*/false);
  EXPECT_EQ(ok.named_parameters()[0].second.flat(1), 0.0);
  for (const io::TensorInfo& t : io::inspect(dir.file("ok")).tensors) EXPECT_EQ(t.nonfinite, 0) << t.name;
}

TEST(Serialize, FileLayoutIsAsDocumented) {
  TempDir dir("serialize");
  io::write_tensors(dir.file("w"), {{"ab", from_vector<float>({1.5f, -2.0f}, {2})}}, "{}");
  std::vector<uint8_t> f = read_bytes(dir.file("w"));
  // magic 8, order 1, version 4, kind 4, metadata 8+2, count 8, name 8+2, dtype 1, rank 1, dim 8, data 8, checksum 8
  ASSERT_EQ(f.size(), 8u + 1 + 4 + 4 + 10 + 8 + 10 + 1 + 1 + 8 + 8 + 8);
  EXPECT_EQ(std::string(f.begin(), f.begin() + 8), "ATTOGRAD");
  EXPECT_EQ(f[8], 1);   // little-endian flag
  EXPECT_EQ(f[9], 1);   // version 1 (u32 LE)
  EXPECT_EQ(f[13], 0);  // kind 0 = weights
  EXPECT_EQ(f[17], 2);  // metadata length
  EXPECT_EQ(std::string(f.begin() + 25, f.begin() + 27), "{}");
  EXPECT_EQ(f[27], 1);  // tensor count
  EXPECT_EQ(f[35], 2);  // name length
  EXPECT_EQ(std::string(f.begin() + 43, f.begin() + 45), "ab");
  EXPECT_EQ(f[45], 0);  // float32
  EXPECT_EQ(f[46], 1);  // rank
  EXPECT_EQ(f[47], 2);  // dim
  float data[2];
  std::memcpy(data, f.data() + 55, 8);
  EXPECT_EQ(data[0], 1.5f);
  EXPECT_EQ(data[1], -2.0f);
  uint64_t stored;
  std::memcpy(&stored, f.data() + f.size() - 8, 8);
  EXPECT_EQ(stored, io::detail::xxh64(f.data(), f.size() - 8));
}

// ---------------------------------------------------------------------------------------------
// Modules

namespace {
// Saves `a`, loads into `b` (built differently), checks b now equals a bitwise and b's tensors kept their storage.
void check_module_round_trip(const nn::Module& a, nn::Module& b) {
  TempDir dir("serialize");
  ASSERT_FALSE(same_state(a, b)) << "the two modules should start different";
  std::vector<std::pair<Tensor, void*>> before;
  for (auto& [n, t] : io::state_dict(b)) before.emplace_back(t, t.raw_data());
  io::save(a, dir.file("m.atto"), R"({"module": ")" + a.type_name() + "\"}");
  io::LoadReport r = io::load(b, dir.file("m.atto"));
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(same_state(a, b));
  auto after = io::state_dict(b);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(after[i].second.is_same(before[i].first)) << after[i].first;
    EXPECT_EQ(after[i].second.raw_data(), before[i].second) << after[i].first << " must be loaded in place";
  }
  for (auto& t : b.parameters()) EXPECT_TRUE(t.requires_grad());
}
}  // namespace

TEST(Serialize, LinearRoundTrip) {
  Generator g1(1), g2(2);
  nn::Linear a(5, 3, true, g1), b(5, 3, true, g2);
  check_module_round_trip(a, b);
  Generator g(3);
  Tensor x = randn({4, 5}, g);
  EXPECT_TRUE(bitwise_equal(a(x), b(x)));
  nn::Linear c(5, 3, false, g1), d(5, 3, false, g2);
  check_module_round_trip(c, d);
}

TEST(Serialize, EmbeddingAndLayerNormRoundTrip) {
  Generator g1(1), g2(2);
  nn::Embedding a(10, 4, 0, g1), b(10, 4, 0, g2);
  check_module_round_trip(a, b);
  nn::LayerNorm la(Shape{2, 3}), lb(Shape{2, 3});
  fill_(la.weight, 0.5);
  fill_(la.bias, -0.25);
  check_module_round_trip(la, lb);
}

TEST(Serialize, MultiheadAttentionRoundTrip) {
  Generator g1(1), g2(2);
  nn::MultiheadAttention a({.embed_dim = 8, .num_heads = 2}, g1), b({.embed_dim = 8, .num_heads = 2}, g2);
  check_module_round_trip(a, b);
  Generator g(5);
  Tensor x = randn({2, 3, 8}, g);
  EXPECT_TRUE(bitwise_equal(a(x, x, x).output, b(x, x, x).output));
  nn::MultiheadAttentionOptions o{.embed_dim = 8, .num_heads = 2, .add_bias_kv = true, .kdim = 5, .vdim = 6};
  nn::MultiheadAttention c(o, g1), d(o, g2);
  check_module_round_trip(c, d);
}

TEST(Serialize, SeedModulesRoundTrip) {
  Generator g1(1), g2(2);
  nn::seed::AttentionSublayer a(2, 8, 4, 3, 0.1, g1), b(2, 8, 4, 3, 0.1, g2);
  check_module_round_trip(a, b);
  nn::PositionwiseFeedForward fa(8, 16, {}, g1), fb(8, 16, {}, g2);
  check_module_round_trip(fa, fb);
  nn::PositionwiseFeedForward sa(8, 16, {.residual_norm = true}, g1), sb(8, 16, {.residual_norm = true}, g2);
  check_module_round_trip(sa, sb);
}

TEST(Serialize, PositionalEncodingBufferIsSaved) {
  nn::PositionalEncoding a(8, 16), b(8, 16);
  auto names = io::state_dict(a);
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0].first, "pe");
  mul_(a.pe, 2.0);  // make the buffers differ
  check_module_round_trip(a, b);
}

TEST(Serialize, NestedModulesUseDottedNames) {
  Generator g1(1), g2(2);
  auto make = [](Generator& g) {
    return std::make_shared<nn::Sequential>(
        std::make_shared<nn::Linear>(4, 8, true, g), std::make_shared<nn::ReLU>(), std::make_shared<nn::LayerNorm>(8),
        std::make_shared<nn::PositionalEncoding>(8, 4), std::make_shared<nn::Linear>(8, 2, true, g));
  };
  auto a = make(g1), b = make(g2);
  std::vector<std::string> names;
  for (auto& [n, t] : io::state_dict(*a)) names.push_back(n);
  EXPECT_EQ(names,
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias", "3.pe"}));
  check_module_round_trip(*a, *b);
}

// ---------------------------------------------------------------------------------------------
// Strict and non-strict loading

TEST(Serialize, StrictLoadNamesEveryProblemInOneError) {
  TempDir dir("serialize");
  Bag file_model({{"a", {2}}, {"b", {3}}, {"c", {4}}, {"e", {2, 2}}}, 1.0);
  io::save(file_model, dir.file("w"));
  Bag model({{"a", {2}}, {"b", {5}}, {"d", {1}}, {"e", {4}}, {"f", {1}}}, 7.0);
  try {
    io::load(model, dir.file("w"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(dir.file("w")), std::string::npos) << msg;
    EXPECT_NE(msg.find("2 missing (in the model, not in the file): d, f"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1 unexpected (in the file, not in the model): c"), std::string::npos) << msg;
    EXPECT_NE(
        msg.find("2 mismatched: b (file [3] float32, model [5] float32), e (file [2, 2] float32, model [4] float32)"),
        std::string::npos)
        << msg;
  }
  // Nothing was copied, not even the matching "a".
  EXPECT_EQ(model.parameter("a").flat(0), 7.0);
}

TEST(Serialize, NonStrictLoadReportsWhatItSkipped) {
  TempDir dir("serialize");
  Bag file_model({{"a", {2}}, {"b", {3}}, {"c", {4}}}, 1.0);
  io::save(file_model, dir.file("w"));
  Bag model({{"a", {2}}, {"b", {5}}, {"d", {1}}}, 7.0);
  io::LoadReport r = io::load(model, dir.file("w"), /*strict=*/false);
  EXPECT_EQ(r.missing, (std::vector<std::string>{"d"}));
  EXPECT_EQ(r.unexpected, (std::vector<std::string>{"c"}));
  EXPECT_EQ(r.mismatched, (std::vector<std::string>{"b"}));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(model.parameter("a").flat(1), 1.0);
  EXPECT_EQ(model.parameter("b").flat(0), 7.0);
  EXPECT_EQ(model.parameter("d").flat(0), 7.0);
}

TEST(Serialize, FloatDtypesConvertOnLoad) {
  TempDir dir("serialize");
  Generator g(4);
  nn::Linear a64(3, 2, true, g);
  a64.to(kFloat64);
  io::save(a64, dir.file("w64"));
  nn::Linear b32(3, 2, true, g);
  EXPECT_TRUE(io::load(b32, dir.file("w64")).ok());
  EXPECT_EQ(b32.weight.dtype(), kFloat32);
  for (int64_t i = 0; i < 6; ++i)
    EXPECT_EQ(b32.weight.flat(i), static_cast<double>(static_cast<float>(a64.weight.flat(i))));

  nn::Linear a32(3, 2, true, g);
  io::save(a32, dir.file("w32"));
  nn::Linear b64(3, 2, true, g);
  b64.to(kFloat64);
  EXPECT_TRUE(io::load(b64, dir.file("w32")).ok());
  EXPECT_EQ(b64.weight.dtype(), kFloat64);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(b64.weight.flat(i), a32.weight.flat(i));
}

TEST(Serialize, FreeFunctionsAreTheModuleMethods) {
  Generator g(5);
  nn::Linear a(3, 2, true, g), b(3, 2, true, g);
  auto sa = io::state_dict(a), ma = a.state_dict();
  ASSERT_EQ(sa.size(), ma.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, ma[i].first);
    EXPECT_TRUE(sa[i].second.is_same(ma[i].second));
  }
  EXPECT_TRUE(io::load_state_dict(b, a.state_dict()).ok());
  EXPECT_TRUE(same_state(a, b));
  // In memory a float dtype difference is explicit (the files above convert): the error names key and dtypes.
  nn::Linear c64(3, 2, {.dtype = kFloat64}, g);
  EXPECT_ATTO_ERROR(
      io::load_state_dict(b, c64.state_dict(), {}, "c64"),
      "load_state_dict: c64: strict load failed: 2 mismatched: weight (state [2, 3] float64, model [2, 3] "
      "float32; pass allow_dtype_cast = true to convert)");
  EXPECT_TRUE(io::load_state_dict(b, c64.state_dict(), {.allow_dtype_cast = true}).ok());
  EXPECT_EQ(b.weight.flat(4), static_cast<double>(static_cast<float>(c64.weight.flat(4))));
  // A checkpoint's module state goes through the same loader (and converts, as files do).
  io::Checkpoint ck;
  io::add_module_state(ck, c64);
  nn::Linear d(3, 2, true, g);
  EXPECT_TRUE(io::load_module_state(ck, d).ok());
  EXPECT_EQ(d.bias.flat(1), static_cast<double>(static_cast<float>(c64.bias.flat(1))));
  ck.tensors.pop_back();
  EXPECT_ATTO_ERROR(io::load_module_state(ck, d),
                    "load_module_state: checkpoint tensors 'model.*': strict load failed: 1 missing (in the model, not "
                    "in the file): bias;");
}

TEST(Serialize, NonFloatDtypeDifferenceIsAMismatch) {
  TempDir dir("serialize");
  io::write_tensors(dir.file("w"), {{"a", from_vector<int64_t>({1, 2}, {2})}});
  Bag model({{"a", {2}}}, 0.0);
  EXPECT_ATTO_ERROR(io::load(model, dir.file("w")), "a (file [2] int64, model [2] float32)");
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(Serialize, ChecksumCatchesAFlippedByte) {
  TempDir dir("serialize");
  Generator g(1);
  nn::Linear a(4, 4, true, g);
  io::save(a, dir.file("w"));
  auto bytes = read_bytes(dir.file("w"));
  bytes[bytes.size() - 20] ^= 0x01;  // a bit of the last weight
  write_bytes(dir.file("w"), bytes);
  nn::Linear b(4, 4, true, g);
  EXPECT_ATTO_ERROR(io::load(b, dir.file("w")), "checksum mismatch");
  EXPECT_ATTO_ERROR(io::load(b, dir.file("w")), dir.file("w"));
}

TEST(Serialize, ReadErrorsNameTheFileAndTheProblem) {
  TempDir dir("serialize");
  EXPECT_ATTO_ERROR(io::read_tensors(dir.file("missing")), "cannot open");
  EXPECT_ATTO_ERROR(io::read_tensors(dir.file("")), "is a directory");
  write_bytes(dir.file("empty"), {});
  EXPECT_ATTO_ERROR(io::read_tensors(dir.file("empty")), "too short");
  write_bytes(dir.file("text"), {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'});
  EXPECT_ATTO_ERROR(io::read_tensors(dir.file("text")), "bad magic");
  io::write_safetensors(dir.file("st"), {{"a", zeros({2})}});
  EXPECT_ATTO_ERROR(io::read_tensors(dir.file("st")), "bad magic");

  io::Checkpoint ck;
  ck.counters = {{"step", 3}};
  io::save_checkpoint(ck, dir.file("ck"));
  EXPECT_ATTO_ERROR(io::read_tensors(dir.file("ck")), "is a checkpoint file, not a weights file (use load_checkpoint)");
  io::write_tensors(dir.file("w"), {{"a", zeros({2})}});
  EXPECT_ATTO_ERROR(io::load_checkpoint(dir.file("w")), "is a weights file, not a checkpoint file");
}

TEST(Serialize, WriteErrorsLeaveNothingBehind) {
  TempDir dir("serialize");
  EXPECT_ATTO_ERROR(io::write_tensors(dir.file("w"), {{"a", zeros({2})}}, "{not json"), "metadata is not valid JSON");
  EXPECT_ATTO_ERROR(io::write_tensors(dir.file("w"), {{"a", zeros({2})}, {"a", zeros({3})}}),
                    "'a' appears more than once");
  EXPECT_ATTO_ERROR(io::write_tensors(dir.file("w"), {{"", zeros({2})}}), "empty name");
  EXPECT_ATTO_ERROR(io::write_tensors(dir.file("w"), {{"u", Tensor()}}), "tensor 'u' is undefined");
  EXPECT_ATTO_ERROR(io::write_tensors(dir.file("no/such/dir/w"), {{"a", zeros({2})}}),
                    "cannot create a temporary file");
  io::Checkpoint ck;
  ck.scalars = {{"lr", 1.0}, {"lr", 2.0}};
  EXPECT_ATTO_ERROR(io::save_checkpoint(ck, dir.file("ck")), "scalar name 'lr' appears more than once");
  EXPECT_TRUE(dir.entries().empty());
}

// ---------------------------------------------------------------------------------------------
// Atomic saves

TEST(Serialize, AtomicSaveSurvivesAFaultAtEveryStage) {
  for (int stage : {io::detail::kFaultAfterOpen, io::detail::kFaultMidWrite, io::detail::kFaultBeforeFsync,
                    io::detail::kFaultBeforeRename}) {
    SCOPED_TRACE(stage);
    TempDir dir("serialize");
    Generator g1(1), g2(2);
    nn::Linear v1(6, 5, true, g1), v2(6, 5, true, g2);
    io::save(v1, dir.file("model.atto"));
    const auto old_bytes = read_bytes(dir.file("model.atto"));

    io::detail::set_fault_point(stage);
    EXPECT_ATTO_ERROR(io::save(v2, dir.file("model.atto")), "injected fault");
    EXPECT_EQ(dir.entries(), (std::vector<std::string>{"model.atto"})) << "the temporary file must be removed";
    EXPECT_EQ(read_bytes(dir.file("model.atto")), old_bytes);
    nn::Linear check(6, 5, true, g2);
    io::load(check, dir.file("model.atto"));
    EXPECT_TRUE(same_state(check, v1));

    // The hook fires once; the next save goes through.
    io::save(v2, dir.file("model.atto"));
    io::load(check, dir.file("model.atto"));
    EXPECT_TRUE(same_state(check, v2));

    // A failed first save leaves no file at all.
    io::detail::set_fault_point(stage);
    EXPECT_ATTO_ERROR(io::save(v2, dir.file("fresh.atto")), "injected fault");
    EXPECT_FALSE(fs::exists(dir.file("fresh.atto")));
    EXPECT_EQ(dir.entries().size(), 1u);
  }
}

TEST(Serialize, SaveKeepsTheModeOfTheFileItReplaces) {
  TempDir dir("serialize");
  io::write_tensors(dir.file("w"), {{"a", zeros({2})}});
  ASSERT_EQ(::chmod(dir.file("w").c_str(), 0600), 0);
  io::write_tensors(dir.file("w"), {{"a", ones({2})}});
  struct stat st;
  ASSERT_EQ(::stat(dir.file("w").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(io::read_tensors(dir.file("w"))[0].second.flat(0), 1.0);
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

TEST(Checkpoint, RoundTripKeepsEverything) {
  TempDir dir("serialize");
  Generator init(11), dropout(12), data(13);
  for (int i = 0; i < 5; ++i) data.next_u64();
  io::Checkpoint ck;
  ck.metadata_json = R"({"model": {"d_model": 8}, "task": "copy"})";
  ck.tensors = {{"model.w", from_vector<float>({1, 2, 3}, {3})}, {"optim.w.exp_avg", from_vector<double>({0.5}, {1})}};
  ck.generators = {{"init", init.get_state()}, {"dropout", dropout.get_state()}, {"data", data.get_state()}};
  ck.counters = {{"step", 1234}, {"epoch", 3}, {"negative", -7}, {"big", std::numeric_limits<int64_t>::max()}};
  ck.scalars = {{"lr", 3e-4}, {"best", std::numeric_limits<double>::quiet_NaN()}, {"inf", -INFINITY}, {"zero", -0.0}};
  ck.metrics_csv = "step,loss\n1,2.5\n2,2.25\n";
  io::save_checkpoint(ck, dir.file("ck"));

  io::Checkpoint back = io::load_checkpoint(dir.file("ck"));
  EXPECT_EQ(back.metadata_json, ck.metadata_json);
  ASSERT_EQ(back.tensors.size(), 2u);
  EXPECT_TRUE(bitwise_equal(back.tensor("model.w"), ck.tensors[0].second));
  EXPECT_TRUE(bitwise_equal(back.tensor("optim.w.exp_avg"), ck.tensors[1].second));
  EXPECT_EQ(back.generators, ck.generators);
  EXPECT_EQ(back.counters, ck.counters);
  ASSERT_EQ(back.scalars.size(), 4u);
  EXPECT_EQ(back.scalar("lr"), 3e-4);
  EXPECT_TRUE(std::isnan(back.scalar("best")));
  EXPECT_EQ(back.scalar("inf"), -INFINITY);
  EXPECT_TRUE(std::signbit(back.scalar("zero")));
  EXPECT_EQ(back.metrics_csv, ck.metrics_csv);
  EXPECT_EQ(back.counter("step"), 1234);

  // A restored generator continues the same stream.
  Generator resumed;
  resumed.set_state(back.generator("data"));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(resumed.next_u64(), data.next_u64());

  EXPECT_ATTO_ERROR(back.counter("nope"), "no counter named 'nope'");
  EXPECT_ATTO_ERROR(back.tensor("nope"), "no tensor named 'nope'");
}

TEST(Checkpoint, TrainingResumesBitExactly) {
  // Train 3 steps, checkpoint, train 2 more; a fresh model and optimizer restored from the checkpoint must
  // reproduce the last 2 steps bit for bit.
  TempDir dir("serialize");
  auto step = [](nn::Linear& m, optim::Optimizer& opt, Generator& data) {
    Tensor x = randn({4, 3}, data);
    Tensor y = m(x);
    Tensor loss = sum(y * y);
    opt.zero_grad();
    loss.backward();
    opt.step();
  };
  Generator g_init(1), g_data(2);
  nn::Linear model(3, 2, true, g_init);
  optim::Adam opt(model.named_parameters(), {.lr = 0.01});
  for (int i = 0; i < 3; ++i) step(model, opt, g_data);

  io::Checkpoint ck;
  io::add_module_state(ck, model);
  io::add_optimizer_state(ck, opt);
  ck.generators = {{"data", g_data.get_state()}};
  ck.counters.emplace_back("step", 3);
  io::save_checkpoint(ck, dir.file("ck"));

  for (int i = 0; i < 2; ++i) step(model, opt, g_data);

  Generator other(99);
  nn::Linear model2(3, 2, true, other);
  optim::Adam opt2(model2.named_parameters(), {.lr = 0.01});
  io::Checkpoint back = io::load_checkpoint(dir.file("ck"));
  EXPECT_TRUE(io::load_module_state(back, model2).ok());
  io::load_optimizer_state(back, opt2);
  EXPECT_EQ(opt2.step_count(), 3);
  Generator data2;
  data2.set_state(back.generator("data"));
  for (int i = 0; i < 2; ++i) step(model2, opt2, data2);
  EXPECT_TRUE(same_state(model, model2));
}

// ---------------------------------------------------------------------------------------------
// inspect()

TEST(Inspect, ListsAWeightsFileWithoutAModel) {
  TempDir dir("serialize");
  io::write_tensors(dir.file("w"),
                    {{"layer.weight", from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3})},
                     {"layer.steps", from_vector<int64_t>({9}, {1})}},
                    R"({"d_model": 3})");
  io::FileInfo info = io::inspect(dir.file("w"));
  EXPECT_EQ(info.kind, "weights");
  EXPECT_EQ(info.format_version, 1u);
  EXPECT_EQ(info.metadata, R"({"d_model": 3})");
  EXPECT_TRUE(info.has_checksum);
  EXPECT_TRUE(info.checksum_ok);
  ASSERT_EQ(info.tensors.size(), 2u);
  EXPECT_EQ(info.tensors[0].name, "layer.weight");
  EXPECT_EQ(info.tensors[0].dtype, kFloat32);
  EXPECT_EQ(info.tensors[0].shape, (Shape{2, 3}));
  EXPECT_EQ(info.tensors[0].nbytes, 24u);
  EXPECT_EQ(info.tensors[1].dtype, kInt64);
  EXPECT_EQ(info.num_elements(), 7);
  auto bytes = read_bytes(dir.file("w"));
  EXPECT_EQ(info.file_size, bytes.size());
  float third;
  std::memcpy(&third, bytes.data() + info.tensors[0].offset + 8, 4);
  EXPECT_EQ(third, 3.0f);
  const std::string text = info.to_string();
  EXPECT_NE(text.find("layer.weight  float32  [2, 3]  24 bytes"), std::string::npos) << text;
  EXPECT_NE(text.find("OK"), std::string::npos) << text;

  // A corrupt data byte: inspect still lists the file and reports the checksum.
  bytes[info.tensors[0].offset] ^= 0x40;
  write_bytes(dir.file("w"), bytes);
  io::FileInfo bad = io::inspect(dir.file("w"));
  EXPECT_FALSE(bad.checksum_ok);
  EXPECT_NE(bad.stored_checksum, bad.computed_checksum);
  EXPECT_NE(bad.to_string().find("MISMATCH"), std::string::npos);
}

TEST(Inspect, ListsCheckpointsAndSafetensors) {
  TempDir dir("serialize");
  io::Checkpoint ck;
  ck.tensors = {{"model.w", zeros({2, 2})}};
  ck.generators = {{"data", Generator(5).get_state()}};
  ck.counters = {{"step", 42}};
  ck.scalars = {{"lr", 0.5}};
  ck.metrics_csv = "a,b\n";
  io::save_checkpoint(ck, dir.file("ck"));
  io::FileInfo info = io::inspect(dir.file("ck"));
  EXPECT_EQ(info.kind, "checkpoint");
  EXPECT_TRUE(info.checksum_ok);
  EXPECT_EQ(info.counters, ck.counters);
  EXPECT_EQ(info.scalars, ck.scalars);
  EXPECT_EQ(info.generators, ck.generators);
  EXPECT_EQ(info.metrics_csv_bytes, 4u);
  EXPECT_NE(info.to_string().find("step = 42"), std::string::npos);

  io::write_safetensors(dir.file("st"), {{"w", zeros({3})}}, {{"k", "v"}});
  io::FileInfo st = io::inspect(dir.file("st"));
  EXPECT_EQ(st.kind, "safetensors");
  EXPECT_FALSE(st.has_checksum);
  EXPECT_EQ(st.metadata, R"({"k":"v"})");
  ASSERT_EQ(st.tensors.size(), 1u);
  EXPECT_EQ(st.tensors[0].shape, (Shape{3}));

  write_bytes(dir.file("junk"), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  EXPECT_ATTO_ERROR(io::inspect(dir.file("junk")),
                    "neither an attograd weights or checkpoint file nor a safetensors file");
}

TEST(Serialize, ParseAllocatesNoMoreThanTheFileSize) {
  TempDir dir("serialize");
  Generator g(1);
  nn::Linear a(16, 16, true, g);
  io::save(a, dir.file("w"));
  auto bytes = read_bytes(dir.file("w"));
  io::parse_tensors_from_memory(bytes.data(), bytes.size());
  auto stats = io::detail::last_parse_stats();
  EXPECT_EQ(stats.input_bytes, bytes.size());
  EXPECT_EQ(stats.max_allocation, 16u * 16 * 4);
  EXPECT_LE(stats.total_allocated, bytes.size());
}

// ---------------------------------------------------------------------------------------------
// Hostile inputs (issue 14)

TEST(Serialize, ReadingAFifoOrADeviceFailsAtOnce) {
  TempDir dir("serialize");
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Opening a FIFO for reading would wait for a writer forever: it is opened without blocking and rejected.
  EXPECT_ATTO_ERROR(io::detail::read_file(fifo, "load"), "not a regular file (a FIFO)");
  EXPECT_ATTO_ERROR(io::inspect(fifo), "a FIFO");
  EXPECT_ATTO_ERROR(io::detail::read_file("/dev/zero", "load"), "not a regular file (a character device)");
}

TEST(Serialize, SavingOverAFifoOrADirectoryIsRefused) {
  // The atomic rename would swap whatever the path names for a regular file: an existing non-regular file is
  // refused and left alone; a regular file is still replaced.
  TempDir dir("serialize");
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_ATTO_ERROR(io::write_tensors(fifo, {}, "{}"), "exists and is not a regular file (a FIFO)");
  struct stat st;
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_ATTO_ERROR(io::write_tensors(dir.file(""), {}, "{}"), "(a directory)");
  const std::string regular = dir.file("w.attograd");
  io::write_tensors(regular, {}, "{}");
  io::write_tensors(regular, {}, "{}");
  EXPECT_TRUE(io::inspect(regular).checksum_ok);
}

TEST(Serialize, DeeplyNestedMetadataIsRejected) {
  TempDir dir("serialize");
  const std::string deep = std::string(80000, '[') + std::string(80000, ']');
  EXPECT_EQ(io::json_depth(deep), 80000);
  EXPECT_EQ(io::json_depth(R"({"a": "[[[{{{", "b": [1, [2]]})"), 3);
  EXPECT_ATTO_ERROR(io::write_tensors(dir.file("w.attograd"), {}, deep), "nested more than 64 levels deep");
  // A file written by hand with such metadata (and a valid checksum) is refused when read.
  io::write_tensors(dir.file("w.attograd"), {}, "[0]");
  std::ifstream in(dir.file("w.attograd"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string header = bytes.substr(0, 8 + 1 + 4 + 4);
  std::string body = header;
  const uint64_t n = deep.size();
  for (int i = 0; i < 8; ++i) body += static_cast<char>((n >> (8 * i)) & 0xff);
  body += deep;
  body += std::string(8, '\0');  // no tensors
  const uint64_t sum = io::detail::xxh64(body.data(), body.size());
  for (int i = 0; i < 8; ++i) body += static_cast<char>((sum >> (8 * i)) & 0xff);
  EXPECT_ATTO_ERROR(io::inspect_memory(reinterpret_cast<const uint8_t*>(body.data()), body.size()),
                    "metadata JSON is nested more than 64 levels deep");
}

TEST(Serialize, NextSaveRemovesStaleTemporariesOfItsOwnTargetOnly) {
  TempDir dir("serialize");
  const std::string target = dir.file("model.attograd");
  auto touch = [](const std::string& p) { std::ofstream(p) << "partial"; };
  touch(target + ".tmp-Ab12Cd");        // a killed save of this target: removed
  touch(target + ".tmp-zz99zz");        // another: removed
  touch(target + ".tmp-short");         // not our pattern (5 characters): kept
  touch(target + ".tmp-Ab12Cd.bak");    // not our pattern: kept
  touch(dir.file("other.attograd.tmp-Ab12Cd"));  // another target's: kept
  touch(target + ".tmp-Locked");        // a save in progress holds its lock: kept
  const int fd = ::open((target + ".tmp-Locked").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  nn::Linear lin(3, 2);
  io::save(lin, target);
  ::close(fd);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"model.attograd", "model.attograd.tmp-Ab12Cd.bak",
                                                   "model.attograd.tmp-Locked", "model.attograd.tmp-short",
                                                   "other.attograd.tmp-Ab12Cd"}));
  // Text outputs are written the same way: atomically, with the same cleanup.
  touch(dir.file("config.json.tmp-Xy34Zw"));
  report::write_text_file(dir.file("config.json"), "{}\n");
  EXPECT_FALSE(fs::exists(dir.file("config.json.tmp-Xy34Zw")));
  EXPECT_ATTO_ERROR(report::write_text_file(dir.file("no/such/dir/x.svg"), ""),
                    "cannot create a temporary file next to it: No such file or directory");
}
