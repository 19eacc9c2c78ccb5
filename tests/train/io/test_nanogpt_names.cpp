// nanoGPT's state-dict names (train/io/nanogpt.h): PyTorch-written goldens of nanoGPT's GPT (golden_nanogpt_names.py)
// import and give the reference's logits; the export writes exactly the reference's names and shapes; export ->
// import is an exact round trip; what nanoGPT cannot express, and a malformed state dict, are refused by name.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "nn/init.h"
#include "nn/models.h"
#include "testing.h"
#include "train/io/files.h"
#include "train/io/nanogpt.h"
#include "train/io/safetensors.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

// The golden list of nanogpt_names.txt: per config line, the (name, shape) pairs of GPT(config).state_dict().
struct GoldenNames {
  io::NanoGPTConfig config;
  std::vector<std::pair<std::string, Shape>> names;
};

std::vector<GoldenNames> golden_names() {
  std::ifstream in(data_path("train/nanogpt_names.txt"));
  EXPECT_TRUE(in.good());
  std::vector<GoldenNames> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("config ", 0) == 0) {
      out.push_back({io::NanoGPTConfig::from_json(line.substr(7), "nanogpt_names.txt"), {}});
      continue;
    }
    std::istringstream words(line);
    std::string name;
    words >> name;
    Shape shape;
    for (int64_t d; words >> d;) shape.push_back(d);
    out.back().names.emplace_back(name, shape);
  }
  return out;
}

std::shared_ptr<nn::SequenceModel> build(const io::NanoGPTConfig& c, uint64_t seed) {
  Generator gen(seed);
  auto m = nn::make_model("lm", io::nanogpt_model_spec(c), gen);
  m->eval();
  // Weights of unit-ish scale (gpt2's init draws N(0, 0.02): logits near zero would prove little).
  NoGradGuard no_grad;
  for (auto& [name, p] : m->named_parameters())
    nn::init::normal_(p, name.find("norm") != std::string::npos && name.ends_with("weight") ? 1.0 : 0.0, 0.3, gen);
  return m;
}

Tensor logits(nn::SequenceModel& m, const Tensor& tokens) {
  NoGradGuard no_grad;
  return m.forward(tokens);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) worst = std::max(worst, std::fabs(a.flat(i) - b.flat(i)));
  return worst;
}

// tests/golden.py's format, for golden_nanogpt_names.py --check.
void write_golden(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::ofstream out(path);
  out << "attograd-golden 1\n";
  for (const auto& [name, t] : tensors) {
    out << "tensor " << name << " " << dtype_name(t.dtype()) << " " << t.dim();
    for (int64_t d : t.shape()) out << " " << d;
    out << "\n";
    char buf[32];
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (t.dtype() == kInt64)
        std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(t.flat(i)));
      else
        std::snprintf(buf, sizeof buf, "%.9g", t.flat(i));
      out << (i ? " " : "") << buf;
    }
    out << "\n";
  }
}

void check_reference(const std::string& stem, bool has_metadata) {
  io::NanoGPTFile f = io::read_nanogpt(data_path("train/" + stem + ".safetensors"));
  EXPECT_EQ(f.has_n_head, has_metadata);
  if (!has_metadata) {
    EXPECT_EQ(f.config.n_head, 0);  // no shape holds it
    f.config.n_head = 2;
  }
  auto m = build(f.config, 99);
  EXPECT_TRUE(io::load_nanogpt(*m, f, stem).ok());
  auto golden = load_golden("train/" + stem + ".golden");
  const Tensor y = logits(*m, golden.at("tokens"));
  EXPECT_TRUE(all_close(y, golden.at("logits"), 1e-5));
  ::testing::Test::RecordProperty("max_abs_error", str_cat(max_abs_diff(y, golden.at("logits"))));
  std::printf("%s: max |attograd logits - nanoGPT's| = %.3g (logits up to %.3g)\n", stem.c_str(),
              max_abs_diff(y, golden.at("logits")), max_abs_diff(y, zeros(y.shape())));
}

// A copy of a file's tensors with `edit` applied, written to `path` with `metadata`.
void rewrite(const std::string& from, const std::string& path,
             const std::function<void(io::NamedTensors&, std::map<std::string, std::string>&)>& edit) {
  io::SafeTensors st = io::read_safetensors(from);
  edit(st.tensors, st.metadata);
  io::write_safetensors(path, st.tensors, st.metadata);
}

std::string import_error(const std::string& path) {
  try {
    io::read_nanogpt(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(NanoGPTNames, ImportsAReferenceGPTWithBiasesAndItsConfig) {
  check_reference("nanogpt_bias", true);
  const io::NanoGPTFile f = io::read_nanogpt(data_path("train/nanogpt_bias.safetensors"));
  EXPECT_EQ(
      f.config,
      (io::NanoGPTConfig{
          .block_size = 8, .vocab_size = 11, .n_layer = 2, .n_head = 2, .n_embd = 8, .dropout = 0.0, .bias = true}));
}

TEST(NanoGPTNames, ImportsABareStateDictWithoutBiasesInferringTheConfig) {
  check_reference("nanogpt_nobias", false);
  const io::NanoGPTFile f = io::read_nanogpt(data_path("train/nanogpt_nobias.safetensors"));
  EXPECT_EQ(
      f.config,
      (io::NanoGPTConfig{
          .block_size = 8, .vocab_size = 11, .n_layer = 2, .n_head = 0, .n_embd = 12, .dropout = 0.0, .bias = false}));
}

TEST(NanoGPTNames, ExportWritesExactlyTheReferenceNamesAndShapes) {
  const auto golden = golden_names();
  ASSERT_EQ(golden.size(), 2u);
  for (const GoldenNames& g : golden) {
    auto m = build(g.config, 5);
    EXPECT_EQ(io::nanogpt_config(*m), g.config);
    const io::NamedTensors sd = io::nanogpt_state_dict(*m);
    ASSERT_EQ(sd.size(), g.names.size()) << g.config.to_json();
    for (size_t i = 0; i < sd.size(); ++i) {
      EXPECT_EQ(sd[i].first, g.names[i].first) << i;
      EXPECT_EQ(sd[i].second.shape(), g.names[i].second) << sd[i].first;
    }
    // PyTorch >= 2.0's nanoGPT: the same without the mask buffers.
    const io::NamedTensors flash = io::nanogpt_state_dict(*m, {.mask_buffer = false});
    size_t j = 0;
    for (const auto& [name, shape] : g.names) {
      if (name.ends_with(".attn.bias")) continue;
      ASSERT_LT(j, flash.size());
      EXPECT_EQ(flash[j++].first, name);
    }
    EXPECT_EQ(j, flash.size());
  }
}

TEST(NanoGPTNames, ExportThenImportIsAnExactRoundTrip) {
  TempDir dir("nanogpt");
  const char* out_dir = std::getenv("ATTOGRAD_NANOGPT_OUT");  // for golden_nanogpt_names.py --check
  for (const GoldenNames& g : golden_names()) {
    for (bool mask : {true, false}) {
      auto a = build(g.config, 7);
      const std::string path = dir.file("export.safetensors");
      io::export_nanogpt(*a, path, {{"note", "round trip"}}, {.mask_buffer = mask});
      const io::SafeTensors st = io::read_safetensors(path);
      EXPECT_EQ(st.metadata.at("nanogpt_config"), g.config.to_json());
      EXPECT_EQ(st.metadata.at("note"), "round trip");
      EXPECT_EQ(st.metadata.at("format"), "pt");
      const io::NanoGPTFile f = io::read_nanogpt(path);
      EXPECT_TRUE(f.has_n_head);
      EXPECT_EQ(f.config, g.config);
      auto b = build(g.config, 8);  // other weights, all overwritten
      EXPECT_TRUE(io::load_nanogpt(*b, f, path).ok());
      const io::NamedTensors ta = io::state_dict(*a), tb = io::state_dict(*b);
      ASSERT_EQ(ta.size(), tb.size());
      for (size_t i = 0; i < ta.size(); ++i) {
        EXPECT_EQ(ta[i].first, tb[i].first);
        EXPECT_TRUE(bitwise_equal(ta[i].second, tb[i].second)) << ta[i].first;
      }
      Generator gen(3);
      const Tensor tokens = randint(0, g.config.vocab_size, {2, g.config.block_size}, gen);
      EXPECT_TRUE(bitwise_equal(logits(*a, tokens), logits(*b, tokens)));
      if (out_dir && mask) {
        const std::string stem = str_cat(out_dir, "/export_", g.config.bias ? "bias" : "nobias");
        io::export_nanogpt(*a, stem + ".safetensors");
        write_golden(stem + ".golden", {{"tokens", tokens}, {"logits", logits(*a, tokens)}});
      }
    }
  }
}

TEST(NanoGPTNames, RefusesWhatNanoGPTCannotExpressNamingTheOption) {
  const nn::ModelSpec ok =
      io::nanogpt_model_spec({.block_size = 8, .vocab_size = 11, .n_layer = 1, .n_head = 2, .n_embd = 8});
  EXPECT_NO_THROW(io::check_nanogpt("lm", ok));
  nn::ModelSpec nobias = ok;
  nobias.architecture.bias = false;
  EXPECT_NO_THROW(io::check_nanogpt("lm", nobias));
  nn::ModelSpec tied_by_default = ok;
  tied_by_default.architecture.head = "default";  // the lm's default head is the tied one
  EXPECT_NO_THROW(io::check_nanogpt("lm", tied_by_default));
  auto refused = [&](const std::string& kind, const std::function<void(nn::ModelSpec&)>& edit,
                     const std::string& option, const std::string& value) {
    nn::ModelSpec s = ok;
    edit(s);
    try {
      io::check_nanogpt(kind, s);
      ADD_FAILURE() << option << ": not refused";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("cannot express " + option + " " + value), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  };
  refused(
      "seq2seq", [](nn::ModelSpec&) {}, "--model", "seq2seq");
  refused(
      "encoder", [](nn::ModelSpec&) {}, "--model", "encoder");
  refused(
      "lm", [](nn::ModelSpec& s) { s.attention.kind = "gqa"; }, "--attention", "gqa");
  refused(
      "lm", [](nn::ModelSpec& s) { s.architecture.positions = "sinusoidal"; }, "--positions", "sinusoidal");
  refused(
      "lm", [](nn::ModelSpec& s) { s.architecture.positions = "rope"; }, "--positions", "rope");
  refused(
      "lm", [](nn::ModelSpec& s) { s.architecture.activation = "gelu-tanh"; }, "--activation", "gelu-tanh");
  refused(
      "lm", [](nn::ModelSpec& s) { s.architecture.activation = "relu"; }, "--activation", "relu");
  refused(
      "lm", [](nn::ModelSpec& s) { s.architecture.norm = "rmsnorm"; }, "--norm", "rmsnorm");
  refused(
      "lm", [](nn::ModelSpec& s) { s.architecture.norm_eps = 1e-6; }, "--norm-eps", "1e-06");
  refused(
      "lm", [](nn::ModelSpec& s) { s.architecture.embed_scale = "sqrt"; }, "--embed-scale", "sqrt");
  refused(
      "lm", [](nn::ModelSpec& s) { s.architecture.head = "untied"; }, "--head", "untied");
  refused(
      "lm", [](nn::ModelSpec& s) { s.d_ff = 24; }, "--d-ff", "24");
  // The default textbook lm: its positions are the first thing nanoGPT lacks.
  refused(
      "lm", [](nn::ModelSpec& s) { s.architecture = {}; }, "--positions", "sinusoidal");
}

TEST(NanoGPTNames, RefusesAMalformedStateDictNamingTheTensors) {
  TempDir dir("nanogpt_bad");
  const std::string ref = data_path("train/nanogpt_bias.safetensors");
  const std::string path = dir.file("bad.safetensors");
  auto erase = [](io::NamedTensors& t, const std::string& name) {
    std::erase_if(t, [&](const auto& p) { return p.first == name; });
  };
  auto find = [](io::NamedTensors& t, const std::string& name) -> Tensor& {
    for (auto& [n, x] : t)
      if (n == name) return x;
    throw Error("test", "no " + name);
  };
  auto expect = [&](const std::string& what, std::initializer_list<std::string> parts) {
    const std::string e = import_error(path);
    for (const std::string& p : parts) EXPECT_NE(e.find(p), std::string::npos) << what << ": " << e;
  };

  rewrite(ref, path, [&](io::NamedTensors& t, auto&) {
    erase(t, "transformer.h.1.mlp.c_fc.bias");
    t.emplace_back("transformer.h.0.attn.rotary.weight", zeros({2}));
  });
  expect("missing and unknown",
         {"missing transformer.h.1.mlp.c_fc.bias", "unknown transformer.h.0.attn.rotary.weight"});

  rewrite(ref, path, [&](io::NamedTensors& t, auto&) {
    for (auto& [n, x] : t)
      if (n == "transformer.h.1.ln_1.weight") n = "transformer.h.900000.ln_1.weight";
  });
  expect("a block index beyond the file",
         {"a tensor of block 900000 (transformer.h.900000.*) in a file of 31 tensors"});

  rewrite(ref, path, [&](io::NamedTensors& t, auto&) { find(t, "transformer.wpe.weight") = zeros({0, 8}); });
  expect("empty wpe", {"must not be empty", "[0, 8]"});

  rewrite(ref, path, [&](io::NamedTensors& t, auto&) { erase(t, "lm_head.weight"); });
  expect("no lm_head", {"missing lm_head.weight"});

  rewrite(ref, path, [&](io::NamedTensors& t, auto&) {
    Tensor& head = find(t, "lm_head.weight");
    head = head.clone();
    head.set({3, 4}, 0.5);
  });
  expect("untied head", {"lm_head.weight differs from transformer.wte.weight", "element 28"});

  rewrite(ref, path, [&](io::NamedTensors& t, auto&) {
    Tensor& w = find(t, "transformer.h.0.attn.c_proj.weight");
    w = w.clone();
    w.set({1, 1}, std::nan(""));
  });
  expect("NaN", {"transformer.h.0.attn.c_proj.weight", "NaN"});

  rewrite(ref, path, [&](io::NamedTensors& t, auto&) { erase(t, "transformer.h.1.attn.bias"); });
  expect("one mask", {"1 of 2 blocks have the causal-mask buffer attn.bias"});

  rewrite(ref, path, [&](io::NamedTensors& t, auto&) {
    Tensor& m = find(t, "transformer.h.0.attn.bias");
    m = m.clone();
    m.set({0, 0, 0, 1}, 1.0);
  });
  expect("mask values", {"'transformer.h.0.attn.bias' is not the causal mask", "element 1 is 1"});

  rewrite(ref, path, [&](io::NamedTensors& t, auto&) { find(t, "transformer.h.0.mlp.c_fc.weight") = zeros({16, 8}); });
  expect("shape", {"'transformer.h.0.mlp.c_fc.weight' has shape [16, 8], expected [32, 8]"});

  rewrite(ref, path, [&](io::NamedTensors&, std::map<std::string, std::string>& meta) {
    meta["nanogpt_config"] =
        R"({"block_size": 8, "vocab_size": 11, "n_layer": 3, "n_head": 2, "n_embd": 8, "dropout": 0.0, "bias": true})";
  });
  expect("metadata", {"does not match the tensors", "\"n_layer\":2"});

  rewrite(ref, path, [&](io::NamedTensors& t, auto&) {
    for (auto& [n, x] : t) x = x.to(kFloat64);  // float64 is fine
  });
  EXPECT_NO_THROW(io::read_nanogpt(path));

  // A model of other sizes refuses the file, naming the field.
  const io::NanoGPTFile f = io::read_nanogpt(ref);
  io::NanoGPTConfig other = f.config;
  other.n_head = 4;
  auto m = build(other, 1);
  try {
    io::load_nanogpt(*m, f, "ref");
    ADD_FAILURE() << "n_head not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_head=2 but the model has n_head=4"), std::string::npos) << e.what();
  }
}
