// safetensors interop (train/io/safetensors.h): round trips, layout, PyTorch-written goldens (a TransformerEncoderLayer
// state_dict imported and run against PyTorch's output), module export/import and errors.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/transformer.h"
#include "testing.h"
#include "train/io/files.h"
#include "train/io/safetensors.h"
#include "train/io/serialize.h"

using namespace attograd;
using namespace attograd::testing;
namespace io = attograd::io;
namespace fs = std::filesystem;

namespace {

// A safetensors file from a header text and a data section.
std::string st_file(const std::string& header, const std::string& data) {
  uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

const Tensor& find(const io::NamedTensors& ts, const std::string& name) {
  for (auto& [n, t] : ts)
    if (n == name) return t;
  throw Error("find", "no tensor " + name);
}

}  // namespace

TEST(Safetensors, RoundTripAllDtypesBitwiseAndAligned) {
  TempDir dir("safetensors");
  io::NamedTensors in = {
      {"mask", from_vector<bool>({true, false, true}, {3})},  // 1-byte elements first in our list
      {"f32", from_vector<float>({1.5f, NAN, -0.0f, 1e-45f, INFINITY}, {5})},
      {"f64", from_vector<double>({1.0 / 3.0, -INFINITY}, {1, 2})},
      {"i64", from_vector<int64_t>({-5, 1LL << 60}, {2})},
      {"scalar", scalar_tensor(7.0)},
      {"empty", zeros({0, 2}, {.dtype = kFloat64})},
  };
  io::write_safetensors(dir.file("t.safetensors"), in, {{"format", "pt"}, {"note", "héllo"}});
  io::SafeTensors back = io::read_safetensors(dir.file("t.safetensors"));
  ASSERT_EQ(back.tensors.size(), in.size());
  for (auto& [name, t] : in) EXPECT_TRUE(bitwise_equal(find(back.tensors, name), t)) << name;
  EXPECT_EQ(back.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"note", "héllo"}}));

  // The header is padded to 8 bytes and every tensor starts aligned to its element size.
  auto bytes = read_bytes(dir.file("t.safetensors"));
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  io::FileInfo info = io::inspect(dir.file("t.safetensors"));
  ASSERT_EQ(info.tensors.size(), in.size());
  for (auto& t : info.tensors) EXPECT_EQ(t.offset % dtype_size(t.dtype), 0u) << t.name;
  EXPECT_EQ(dir.count(), 1u);
}

TEST(Safetensors, ReadsPyTorchWrittenMixedDtypes) {
  io::SafeTensors st = io::read_safetensors(data_path("train/mixed.safetensors"));
  auto golden = load_golden("train/mixed.golden");
  ASSERT_EQ(st.tensors.size(), golden.size());
  for (auto& [name, expected] : golden) {
    SCOPED_TRACE(name);
    const Tensor& t = find(st.tensors, name);
    EXPECT_EQ(t.dtype(), expected.dtype());
    EXPECT_TRUE(all_close(t, expected, 0.0));
  }
  EXPECT_EQ(find(st.tensors, "i64").to_vector<int64_t>(),
            (std::vector<int64_t>{-(int64_t{1} << 62), -1, 0, 7, int64_t{1} << 62}));
  EXPECT_EQ(find(st.tensors, "scalar").dim(), 0);
  EXPECT_EQ(find(st.tensors, "empty").shape(), (Shape{0, 4}));
  EXPECT_EQ(st.metadata.at("note"), "mixed dtypes");
}

namespace {
void check_encoder_golden(const std::string& stem, nn::TransformerEncoderLayerOptions opts) {
  Generator g(123);
  nn::TransformerEncoderLayer layer(opts, g);
  layer.eval();
  io::LoadReport r = io::import_safetensors(layer, data_path("train/" + stem + ".safetensors"));
  EXPECT_TRUE(r.ok());
  auto golden = load_golden("train/" + stem + ".golden");
  Tensor y = layer(golden.at("x"));
  EXPECT_TRUE(all_close(y, golden.at("y"), 1e-5));
  double worst = 0;
  for (int64_t i = 0; i < y.numel(); ++i) worst = std::max(worst, std::fabs(y.flat(i) - golden.at("y").flat(i)));
  ::testing::Test::RecordProperty("max_abs_error", str_cat(worst));
}
}  // namespace

TEST(Safetensors, ImportsAPyTorchTransformerEncoderLayer) {
  check_encoder_golden("encoder_layer", {.d_model = 8, .nhead = 2, .dim_feedforward = 16});
}

TEST(Safetensors, ImportsAPyTorchPreNormGeluEncoderLayer) {
  check_encoder_golden("encoder_layer_prenorm",
                       {.d_model = 8, .nhead = 2, .dim_feedforward = 16, .activation = "gelu", .norm_first = true});
}

TEST(Safetensors, PyTorchStateDictNamesMatchOurs) {
  io::FileInfo info = io::inspect(data_path("train/encoder_layer.safetensors"));
  std::vector<std::string> theirs;
  for (auto& t : info.tensors) theirs.push_back(t.name);
  std::sort(theirs.begin(), theirs.end());
  nn::TransformerEncoderLayer layer({.d_model = 8, .nhead = 2, .dim_feedforward = 16});
  std::vector<std::string> ours;
  for (auto& [n, t] : io::state_dict(layer)) ours.push_back(n);
  std::sort(ours.begin(), ours.end());
  EXPECT_EQ(ours, theirs);
}

TEST(Safetensors, ExportImportModule) {
  TempDir dir("safetensors");
  Generator g1(1), g2(2);
  nn::TransformerEncoderLayer a({.d_model = 8, .nhead = 2, .dim_feedforward = 16}, g1);
  nn::TransformerEncoderLayer b({.d_model = 8, .nhead = 2, .dim_feedforward = 16}, g2);
  io::export_safetensors(a, dir.file("a.safetensors"), {{"format", "pt"}});
  Tensor before = b.linear1->weight;
  EXPECT_TRUE(io::import_safetensors(b, dir.file("a.safetensors")).ok());
  EXPECT_TRUE(b.linear1->weight.is_same(before));  // loaded in place
  auto sa = io::state_dict(a), sb = io::state_dict(b);
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_TRUE(bitwise_equal(sa[i].second, sb[i].second)) << sa[i].first;

  // Prefix renaming: the same file into a TransformerEncoder's first layer.
  nn::TransformerEncoder enc({.d_model = 8, .nhead = 2, .dim_feedforward = 16}, 1, false, g2);
  EXPECT_TRUE(io::import_safetensors(enc, dir.file("a.safetensors"), true, {{"", "layers.0."}}).ok());
  EXPECT_TRUE(bitwise_equal(enc.layer(0)->attention<nn::MultiheadAttention>()->in_proj_weight,
                            a.attention<nn::MultiheadAttention>()->in_proj_weight));
}

TEST(Safetensors, ImportIsStrictAndConvertsDtypes) {
  TempDir dir("safetensors");
  Generator g(1);
  nn::Linear lin(4, 3, true, g);
  lin.to(kFloat64);
  io::export_safetensors(lin, dir.file("lin"));
  nn::Linear f32(4, 3, true, g);
  EXPECT_TRUE(io::import_safetensors(f32, dir.file("lin")).ok());
  EXPECT_EQ(f32.weight.flat(5), static_cast<double>(static_cast<float>(lin.weight.flat(5))));

  nn::Linear other(4, 2, true, g);
  EXPECT_ATTO_ERROR(
      io::import_safetensors(other, dir.file("lin")),
      "2 mismatched: weight (file [3, 4] float64, model [2, 4] float32), bias (file [3] float64, model [2] "
      "float32)");
  nn::LayerNorm ln(3);
  io::LoadReport r = io::import_safetensors(ln, dir.file("lin"), /*strict=*/false);
  EXPECT_EQ(r.mismatched, (std::vector<std::string>{"weight"}));
  EXPECT_TRUE(r.missing.empty());
  EXPECT_TRUE(r.unexpected.empty());
  EXPECT_EQ(ln.bias.flat(0), static_cast<double>(static_cast<float>(lin.bias.flat(0))));
}

TEST(Safetensors, SavesAreAtomic) {
  TempDir dir("safetensors");
  io::write_safetensors(dir.file("w"), {{"a", zeros({2})}});
  for (int stage : {io::detail::kFaultAfterOpen, io::detail::kFaultMidWrite, io::detail::kFaultBeforeFsync,
                    io::detail::kFaultBeforeRename}) {
    io::detail::set_fault_point(stage);
    EXPECT_ATTO_ERROR(io::write_safetensors(dir.file("w"), {{"a", ones({2})}}), "injected fault");
    EXPECT_EQ(dir.count(), 1u);
    EXPECT_EQ(io::read_safetensors(dir.file("w")).tensors[0].second.flat(0), 0.0);
  }
}

TEST(Safetensors, WriteErrors) {
  TempDir dir("safetensors");
  EXPECT_ATTO_ERROR(io::write_safetensors(dir.file("x"), {{"__metadata__", zeros({1})}}), "cannot name a tensor");
  EXPECT_ATTO_ERROR(io::write_safetensors(dir.file("x"), {{"a", zeros({1})}, {"a", zeros({1})}}), "more than once");
  EXPECT_ATTO_ERROR(io::write_safetensors(dir.file("x"), {{"bad\xff", zeros({1})}}), "must be UTF-8");
  EXPECT_EQ(dir.count(), 0u);
}

TEST(Safetensors, ReadErrorsNameTheTensorAndTheProblem) {
  TempDir dir("safetensors");
  struct Case {
    std::string bytes, message;
  };
  const std::string f8(8, '\0');
  std::vector<Case> cases = {
      {"abc", "too short"},
      {st_file(R"({"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})", "xx"),
       "tensor 'a': unsupported dtype 'F16'"},
      {st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "xxxx"),
       "tensor 'a': shape [2] F32 needs 8 bytes but data_offsets [0, 4] span 4"},
      {st_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "xxxx"), "tensor 'a': negative dim -1"},
      {st_file(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "xxxx"), "non-integer number"},
      {st_file(
           R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},"b":{"dtype":"F64","shape":[1],"data_offsets":[4,12]}})",
           f8 + "xxxx"),
       "overlaps"},
      {st_file(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[8,16]}})", f8 + f8), "gap of 8 bytes"},
      {st_file(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", f8 + "x"), "trailing bytes"},
      {st_file(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", "x"), "run past the 1-byte data section"},
      {st_file(
           R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},"a":{"dtype":"F64","shape":[1],"data_offsets":[8,16]}})",
           f8 + f8),
       "duplicate tensor name 'a'"},
      {st_file(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8],"extra":1}})", f8), "unknown field 'extra'"},
      {st_file(R"({"a":{"dtype":"F64","shape":[1]}})", f8), "missing field"},
      {st_file(R"({"__metadata__":{"k":1}})", ""), "__metadata__ value 'k' must be a string"},
      {st_file(R"([1,2])", ""), "the header must be a JSON object"},
      {st_file(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", "xxxx"), "rank exceeds"},
      {st_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", "xxxx"),
       "overflows 64 bits"},
      {st_file(R"({"a":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}})", "\x02"), "has byte value 2"},
      {st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} junk)", "xxxx"), "invalid JSON header"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10), "exceeds the cap"},
      {std::string("\x10\x00\x00\x00\x00\x00\x00\x00{}", 10), "exceeds the 2 bytes after it"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].message);
    write_string(dir.file("bad"), cases[i].bytes);
    EXPECT_ATTO_ERROR(io::read_safetensors(dir.file("bad")), cases[i].message);
    EXPECT_ATTO_ERROR(io::read_safetensors(dir.file("bad")), dir.file("bad"));
  }
  // Empty header object and no data is a valid (empty) file.
  write_string(dir.file("ok"), st_file("{}      ", ""));
  EXPECT_TRUE(io::read_safetensors(dir.file("ok")).tensors.empty());
}
