#include "train/io/nanogpt.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "train/io/safetensors.h"

namespace attograd::io {

namespace {

using json = nlohmann::json;

// One block's names: attograd's suffix after "blocks.{i}." and nanoGPT's after "transformer.h.{i}.", in nanoGPT's
// state_dict order (a module's own parameters, then its buffers, then its children).
struct BlockName {
  const char* ours;
  const char* theirs;
  bool bias;  // present only with GPTConfig.bias
};
constexpr BlockName kBlockNames[] = {
    {"norm1.weight", "ln_1.weight", false},
    {"norm1.bias", "ln_1.bias", true},
    {"self_attn.in_proj_weight", "attn.c_attn.weight", false},
    {"self_attn.in_proj_bias", "attn.c_attn.bias", true},
    {"self_attn.out_proj.weight", "attn.c_proj.weight", false},
    {"self_attn.out_proj.bias", "attn.c_proj.bias", true},
    {"norm2.weight", "ln_2.weight", false},
    {"norm2.bias", "ln_2.bias", true},
    {"ff.linear1.weight", "mlp.c_fc.weight", false},
    {"ff.linear1.bias", "mlp.c_fc.bias", true},
    {"ff.linear2.weight", "mlp.c_proj.weight", false},
    {"ff.linear2.bias", "mlp.c_proj.bias", true},
};

std::string block(int64_t i) { return str_cat("blocks.", i, "."); }
std::string h(int64_t i) { return str_cat("transformer.h.", i, "."); }

// Every (attograd name, nanoGPT name, shape) of a config, in nanoGPT's order; lm_head and the masks excluded.
struct Mapped {
  std::string ours, theirs;
  Shape shape;
};
std::vector<Mapped> mapping(const NanoGPTConfig& c) {
  const int64_t D = c.n_embd, F = 4 * c.n_embd;
  std::vector<Mapped> out = {{"embed.weight", "transformer.wte.weight", {c.vocab_size, D}},
                             {"pos_embed.weight", "transformer.wpe.weight", {c.block_size, D}}};
  const std::unordered_map<std::string, Shape> shapes = {{"ln_1.weight", {D}},
                                                         {"ln_1.bias", {D}},
                                                         {"attn.c_attn.weight", {3 * D, D}},
                                                         {"attn.c_attn.bias", {3 * D}},
                                                         {"attn.c_proj.weight", {D, D}},
                                                         {"attn.c_proj.bias", {D}},
                                                         {"ln_2.weight", {D}},
                                                         {"ln_2.bias", {D}},
                                                         {"mlp.c_fc.weight", {F, D}},
                                                         {"mlp.c_fc.bias", {F}},
                                                         {"mlp.c_proj.weight", {D, F}},
                                                         {"mlp.c_proj.bias", {D}}};
  for (int64_t i = 0; i < c.n_layer; ++i)
    for (const BlockName& b : kBlockNames)
      if (!b.bias || c.bias) out.push_back({block(i) + b.ours, h(i) + b.theirs, shapes.at(b.theirs)});
  out.push_back({"norm.weight", "transformer.ln_f.weight", {D}});
  if (c.bias) out.push_back({"norm.bias", "transformer.ln_f.bias", {D}});
  return out;
}

Tensor causal_mask_buffer(int64_t block_size) {
  std::vector<float> v(static_cast<size_t>(block_size * block_size), 0.0f);
  for (int64_t i = 0; i < block_size; ++i)
    for (int64_t j = 0; j <= i; ++j) v[static_cast<size_t>(i * block_size + j)] = 1.0f;
  return from_vector(v, {1, 1, block_size, block_size});
}

std::string join(const std::vector<std::string>& names, size_t most = 12) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < most; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > most) out += str_cat(" and ", names.size() - most, " more");
  return out;
}

}  // namespace

std::string NanoGPTConfig::to_json() const {
  nlohmann::ordered_json j = {
      {"block_size", block_size}, {"vocab_size", vocab_size}, {"n_layer", n_layer}, {"n_head", n_head},
      {"n_embd", n_embd},         {"dropout", dropout},       {"bias", bias}};
  return j.dump();
}

NanoGPTConfig NanoGPTConfig::from_json(const std::string& text, const std::string& origin) {
  const char* op = "nanogpt_config";
  const json j = json::parse(text, nullptr, false);
  ATTO_CHECK(j.is_object(), op, origin, ": \"", kNanoGPTConfigKey, "\" is not a JSON object");
  NanoGPTConfig c;
  std::set<std::string> seen;
  for (const auto& [key, v] : j.items()) {
    int64_t* field = key == "block_size"   ? &c.block_size
                     : key == "vocab_size" ? &c.vocab_size
                     : key == "n_layer"    ? &c.n_layer
                     : key == "n_head"     ? &c.n_head
                     : key == "n_embd"     ? &c.n_embd
                                           : nullptr;
    if (field) {
      ATTO_CHECK(v.is_number_integer(), op, origin, ": GPTConfig field '", key, "' must be an integer, got ", v.dump());
      *field = v.get<int64_t>();
    } else if (key == "dropout") {
      ATTO_CHECK(v.is_number(), op, origin, ": GPTConfig field 'dropout' must be a number, got ", v.dump());
      c.dropout = v.get<double>();
    } else if (key == "bias") {
      ATTO_CHECK(v.is_boolean(), op, origin, ": GPTConfig field 'bias' must be true or false, got ", v.dump());
      c.bias = v.get<bool>();
    } else {
      throw Error(op, str_cat(origin, ": unknown GPTConfig field '", key,
                              "' (block_size, vocab_size, n_layer, n_head, n_embd, dropout, bias)"));
    }
    seen.insert(key);
  }
  for (const char* k : {"block_size", "vocab_size", "n_layer", "n_head", "n_embd", "dropout", "bias"})
    ATTO_CHECK(seen.count(k), op, origin, ": the GPTConfig has no field '", k, "'");
  return c;
}

void check_nanogpt(const std::string& kind, const nn::ModelSpec& spec) {
  const char* op = "nanogpt";
  auto refuse = [&](const std::string& option, const std::string& value, const std::string& need) {
    throw Error(op, str_cat("nanoGPT's GPT cannot express ", option, " ", value, " (it needs ", need, ")"));
  };
  if (kind != "lm") refuse("--model", kind, "lm, a decoder-only model");
  const nn::AttentionSpec& at = spec.attention;
  if (at.rope) refuse("--rope", "", "learned positions");
  // Plain multi-head attention: the default spec (checkpointing changes no weight).
  if (at != nn::AttentionSpec{.checkpoint = at.checkpoint}) refuse("--attention", at.kind + at.to_json(), "plain mha");
  const nn::ArchitectureSpec& a = spec.architecture;
  if (a.positions != "learned") refuse("--positions", a.positions, "learned");
  if (a.activation != "gelu") refuse("--activation", a.activation, "gelu");
  if (a.norm != "layernorm") refuse("--norm", a.norm, "layernorm");
  if (a.norm_eps != 1e-5) refuse("--norm-eps", str_cat(a.norm_eps), "1e-5");
  if (a.embed_scale != "none") refuse("--embed-scale", a.embed_scale, "none");
  if (a.head == "untied") refuse("--head", a.head, "tied");
  if (spec.d_ff != 4 * spec.d_model) refuse("--d-ff", str_cat(spec.d_ff), str_cat("4 d_model = ", 4 * spec.d_model));
}

NanoGPTConfig nanogpt_config(const nn::SequenceModel& model) {
  const nn::ModelSpec& s = model.spec();
  check_nanogpt(model.kind(), s);
  NanoGPTConfig c{.vocab_size = s.vocab,
                  .n_layer = s.layers,
                  .n_head = s.heads,
                  .n_embd = s.d_model,
                  .dropout = s.dropout,
                  .bias = s.architecture.bias};
  for (const auto& [name, p] : model.named_parameters())
    if (name == "pos_embed.weight") c.block_size = p.size(0);
  ATTO_CHECK(c.block_size > 0, "nanogpt", "the model has no pos_embed.weight (learned positions)");
  return c;
}

nn::ModelSpec nanogpt_model_spec(const NanoGPTConfig& c) {
  const char* op = "nanogpt";
  ATTO_CHECK(c.block_size > 0 && c.vocab_size > 0 && c.n_layer >= 0 && c.n_head > 0 && c.n_embd > 0, op,
             "GPTConfig sizes must be positive (n_layer non-negative), got block_size=", c.block_size,
             ", vocab_size=", c.vocab_size, ", n_layer=", c.n_layer, ", n_head=", c.n_head, ", n_embd=", c.n_embd);
  ATTO_CHECK(c.n_embd % c.n_head == 0, op, "GPTConfig n_head=", c.n_head, " must divide n_embd=", c.n_embd);
  ATTO_CHECK(c.dropout >= 0 && c.dropout < 1, op, "GPTConfig dropout must be in [0, 1), got ", c.dropout);
  nn::ModelSpec s;
  s.vocab = c.vocab_size;
  s.layers = c.n_layer;
  s.d_model = c.n_embd;
  s.heads = c.n_head;
  s.d_ff = 4 * c.n_embd;
  s.dropout = c.dropout;
  s.max_source_len = c.block_size;
  s.max_target_len = 1;
  s.stream = true;
  s.architecture = {.positions = "learned",
                    .activation = "gelu",
                    .norm = "layernorm",
                    .norm_eps = 1e-5,
                    .bias = c.bias,
                    .embed_scale = "none",
                    .init = "gpt2",
                    .head = "tied",
                    .recipe = "nanogpt"};
  return s;
}

NamedTensors nanogpt_state_dict(const nn::SequenceModel& model, const NanoGPTWriteOptions& options) {
  const NanoGPTConfig c = nanogpt_config(model);
  const NamedTensors ours = state_dict(model);
  std::unordered_map<std::string, Tensor> by_name(ours.begin(), ours.end());
  const std::vector<Mapped> map = mapping(c);
  std::vector<std::string> unmapped;
  std::set<std::string> mapped_names;
  for (const Mapped& m : map) mapped_names.insert(m.ours);
  for (const auto& [name, _] : ours)
    if (!mapped_names.count(name)) unmapped.push_back(name);
  ATTO_CHECK(unmapped.empty(), "nanogpt", "the model has tensors nanoGPT has no name for: ", join(unmapped));
  NamedTensors out;
  for (const Mapped& m : map) {
    auto it = by_name.find(m.ours);
    ATTO_CHECK(it != by_name.end(), "nanogpt", "the model has no tensor '", m.ours, "' (nanoGPT's '", m.theirs, "')");
    ATTO_CHECK(it->second.shape() == m.shape, "nanogpt", "'", m.ours, "' has shape ", it->second.shape(),
               ", nanoGPT's '", m.theirs, "' needs ", m.shape);
    out.emplace_back(m.theirs, it->second);
    // nanoGPT's order: the mask buffer of a CausalSelfAttention comes before its children (c_attn, c_proj).
    if (options.mask_buffer && m.theirs.starts_with("transformer.h.") &&
        m.theirs.ends_with(c.bias ? ".ln_1.bias" : ".ln_1.weight")) {
      const std::string prefix = m.theirs.substr(0, m.theirs.find(".ln_1."));
      out.emplace_back(prefix + ".attn.bias", causal_mask_buffer(c.block_size).to(it->second.dtype()));
    }
  }
  out.emplace_back("lm_head.weight", by_name.at("embed.weight").detach().clone());
  return out;
}

void export_nanogpt(const nn::SequenceModel& model, const std::string& path,
                    const std::map<std::string, std::string>& metadata, const NanoGPTWriteOptions& options) {
  std::map<std::string, std::string> meta = metadata;
  meta[kNanoGPTConfigKey] = nanogpt_config(model).to_json();
  meta.emplace("format", "pt");
  write_safetensors(path, nanogpt_state_dict(model, options), meta);
}

NanoGPTFile read_nanogpt(const std::string& path, const ReadOptions& options) {
  const char* op = "import";
  const std::string origin = "'" + path + "'";
  SafeTensors st = read_safetensors(path);
  std::unordered_map<std::string, Tensor> file;
  for (auto& [name, t] : st.tensors) {
    ATTO_CHECK(t.dtype() == kFloat32 || t.dtype() == kFloat64, op, origin, ": tensor '", name, "' is ",
               dtype_name(t.dtype()), " (nanoGPT's tensors are float32 or float64)");
    if (!options.allow_nonfinite) detail::check_finite(t, name, path, op);
    file.emplace(name, t);
  }
  NanoGPTFile out;
  out.metadata = st.metadata;
  // The config: from the metadata, else from the shapes.
  auto wte = file.find("transformer.wte.weight"), wpe = file.find("transformer.wpe.weight");
  ATTO_CHECK(wte != file.end() && wpe != file.end(), op, origin,
             " is not a nanoGPT state dict: it has no transformer.wte.weight or no transformer.wpe.weight");
  ATTO_CHECK(wte->second.dim() == 2 && wpe->second.dim() == 2, op, origin,
             ": transformer.wte.weight and transformer.wpe.weight must be 2-D, got ", wte->second.shape(), " and ",
             wpe->second.shape());
  ATTO_CHECK(wte->second.numel() > 0 && wpe->second.numel() > 0, op, origin,
             ": transformer.wte.weight and transformer.wpe.weight must not be empty, got ", wte->second.shape(),
             " and ", wpe->second.shape());
  NanoGPTConfig inferred{.block_size = wpe->second.size(0),
                         .vocab_size = wte->second.size(0),
                         .n_embd = wte->second.size(1),
                         .bias = file.count("transformer.ln_f.bias") > 0};
  for (const auto& [name, _] : file)
    if (name.starts_with("transformer.h.")) {
      const std::string rest = name.substr(14);
      const size_t dot = rest.find('.');
      if (dot == std::string::npos || dot == 0 || dot > 6 ||
          !std::all_of(rest.begin(), rest.begin() + dot, [](char ch) { return ch >= '0' && ch <= '9'; }))
        continue;  // reported as unknown below
      inferred.n_layer = std::max<int64_t>(inferred.n_layer, std::stoll(rest.substr(0, dot)) + 1);
    }
  // A block holds at least 5 tensors (ln_1, c_attn, c_proj, ln_2, c_fc, c_proj weights): a higher block index
  // than the file has tensors for is a malformed name, reported before listing n_layer blocks' names.
  ATTO_CHECK(inferred.n_layer <= static_cast<int64_t>(st.tensors.size()), op, origin, ": a tensor of block ",
             inferred.n_layer - 1, " (transformer.h.", inferred.n_layer - 1, ".*) in a file of ", st.tensors.size(),
             " tensors: blocks 0 to ", inferred.n_layer - 2, " cannot all be there");
  if (auto it = st.metadata.find(kNanoGPTConfigKey); it != st.metadata.end()) {
    out.config = NanoGPTConfig::from_json(it->second, origin);
    out.has_n_head = true;
    NanoGPTConfig cmp = out.config;
    cmp.n_head = 0;
    cmp.dropout = 0;
    ATTO_CHECK(cmp == inferred, op, origin, ": the metadata's GPTConfig ", it->second,
               " does not match the tensors, which give ", inferred.to_json(), " (n_head and dropout aside)");
  } else {
    out.config = inferred;
  }
  const NanoGPTConfig& c = out.config;
  // Every name, every shape.
  std::vector<Mapped> map = mapping(c);
  std::set<std::string> expected;
  for (const Mapped& m : map) expected.insert(m.theirs);
  expected.insert("lm_head.weight");
  std::vector<std::string> missing, unknown, masks;
  for (const Mapped& m : map)
    if (!file.count(m.theirs)) missing.push_back(m.theirs);
  if (!file.count("lm_head.weight")) missing.push_back("lm_head.weight");
  for (const auto& [name, _] : st.tensors) {
    if (expected.count(name)) continue;
    bool mask = false;
    for (int64_t i = 0; i < c.n_layer && !mask; ++i) mask = name == h(i) + "attn.bias";
    (mask ? masks : unknown).push_back(name);
  }
  std::sort(unknown.begin(), unknown.end());
  ATTO_CHECK(missing.empty() && unknown.empty(), op, origin, " does not hold a nanoGPT GPT with ", c.to_json(), ":",
             missing.empty() ? "" : str_cat(" missing ", join(missing)), missing.empty() || unknown.empty() ? "" : ";",
             unknown.empty() ? "" : str_cat(" unknown ", join(unknown)));
  for (const Mapped& m : map) {
    const Tensor& t = file.at(m.theirs);
    ATTO_CHECK(t.shape() == m.shape, op, origin, ": '", m.theirs, "' has shape ", t.shape(), ", expected ", m.shape,
               " for ", c.to_json());
    out.tensors.emplace_back(m.ours, t);
  }
  const Tensor& head = file.at("lm_head.weight");
  ATTO_CHECK(head.shape() == wte->second.shape(), op, origin, ": 'lm_head.weight' has shape ", head.shape(),
             ", expected ", wte->second.shape(), " (the same as transformer.wte.weight)");
  {
    const Tensor a = wte->second.to(kFloat64), b = head.to(kFloat64);
    for (int64_t i = 0; i < a.numel(); ++i)
      ATTO_CHECK(a.flat(i) == b.flat(i) || (std::isnan(a.flat(i)) && std::isnan(b.flat(i))), op, origin,
                 ": lm_head.weight differs from transformer.wte.weight (element ", i, ": ", b.flat(i), " vs ",
                 a.flat(i), "); nanoGPT ties them, an untied head is not nanoGPT's");
  }
  ATTO_CHECK(masks.empty() || static_cast<int64_t>(masks.size()) == c.n_layer, op, origin, ": ", masks.size(), " of ",
             c.n_layer, " blocks have the causal-mask buffer attn.bias (nanoGPT has it in every block or none)");
  const Shape mask_shape = {1, 1, c.block_size, c.block_size};
  for (const std::string& name : masks) {
    const Tensor& t = file.at(name);
    ATTO_CHECK(t.shape() == mask_shape, op, origin, ": '", name, "' has shape ", t.shape(), ", expected ", mask_shape,
               " (the causal mask tril(ones(block_size, block_size)))");
  }
  const Tensor want = masks.empty() ? Tensor() : causal_mask_buffer(c.block_size);  // as large as a mask of the file
  for (const std::string& name : masks) {
    const Tensor v = file.at(name).to(kFloat32);
    for (int64_t i = 0; i < v.numel(); ++i)
      ATTO_CHECK(v.flat(i) == want.flat(i), op, origin, ": '", name, "' is not the causal mask tril(ones) (element ", i,
                 " is ", v.flat(i), ")");
  }
  return out;
}

LoadReport load_nanogpt(nn::SequenceModel& model, const NanoGPTFile& file, const std::string& origin) {
  const NanoGPTConfig mine = nanogpt_config(model), &theirs = file.config;
  auto same = [&](const char* field, int64_t a, int64_t b) {
    ATTO_CHECK(a == b, "import", origin, " holds a GPT with ", field, "=", b, " but the model has ", field, "=", a);
  };
  same("block_size", mine.block_size, theirs.block_size);
  same("vocab_size", mine.vocab_size, theirs.vocab_size);
  same("n_layer", mine.n_layer, theirs.n_layer);
  if (file.has_n_head) same("n_head", mine.n_head, theirs.n_head);
  same("n_embd", mine.n_embd, theirs.n_embd);
  same("bias", mine.bias, theirs.bias);
  return detail::load_into(model, file.tensors, true, origin, "import");
}

}  // namespace attograd::io
