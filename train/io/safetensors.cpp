#include "train/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <ostream>
#include <unordered_set>

#include "nn/module.h"

namespace attograd::io {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

using json = nlohmann::json;

std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 200; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > 200) out += str_cat("... (", s.size(), " bytes)");
  return out;
}

const char* st_dtype_name(Dtype d) {
  switch (d) {
    case Dtype::Float32:
      return "F32";
    case Dtype::Float64:
      return "F64";
    case Dtype::Int64:
      return "I64";
    case Dtype::Bool:
      return "BOOL";
  }
  return "?";
}

bool st_dtype_from_name(const std::string& s, Dtype* out) {
  if (s == "F32")
    *out = kFloat32;
  else if (s == "F64")
    *out = kFloat64;
  else if (s == "I64")
    *out = kInt64;
  else if (s == "BOOL")
    *out = kBool;
  else
    return false;
  return true;
}

// One tensor entry of the header, as parsed.
struct Entry {
  std::string name;
  std::string dtype_text;
  Shape shape;
  std::vector<uint64_t> offsets;
  bool has_dtype = false, has_shape = false, has_offsets = false;
  Dtype dtype = kFloat32;
  uint64_t nbytes = 0;
};

// A SAX handler that accepts only the safetensors header structure and records the first violation.
// Nothing deeper than {name: {field: [numbers]}} is ever accepted, so memory stays proportional to the header.
class HeaderSax {
 public:
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
  std::string error;

  bool null() { return unexpected("null"); }
  bool boolean(bool) { return unexpected("a boolean"); }
  bool number_integer(json::number_integer_t v) {
    if (state_ == State::Shape) return fail(str_cat("negative dim ", v, " in shape"));
    if (state_ == State::Offsets) return fail(str_cat("negative data offset ", v));
    return unexpected("a number");
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (state_ == State::Shape) {
      if (entries.back().shape.size() >= static_cast<size_t>(kMaxRank))
        return fail(str_cat("rank exceeds the maximum of ", kMaxRank));
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return fail(str_cat("dim ", v, " is too large"));
      entries.back().shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (state_ == State::Offsets) {
      if (entries.back().offsets.size() >= 2) return fail("data_offsets must have exactly 2 entries");
      entries.back().offsets.push_back(v);
      return true;
    }
    return unexpected("a number");
  }
  bool number_float(json::number_float_t, const std::string& text) {
    if (state_ == State::Shape || state_ == State::Offsets)
      return fail(str_cat("non-integer number ", printable(text), " in ", field_));
    return unexpected("a number");
  }
  bool string(std::string& s) {
    if (state_ == State::Meta) {
      detail::note_allocation(s.size());
      metadata.emplace(key_, s);
      return true;
    }
    if (state_ == State::Tensor && field_ == "dtype") {
      entries.back().dtype_text = s;
      return true;
    }
    return unexpected("a string");
  }
  bool binary(json::binary_t&) { return unexpected("binary data"); }
  bool start_object(std::size_t) {
    if (state_ == State::Start) {
      state_ = State::Root;
      return true;
    }
    if (state_ == State::Root) {
      if (key_ == "__metadata__") {
        state_ = State::Meta;
      } else {
        detail::note_allocation(key_.size());
        entries.emplace_back();
        entries.back().name = key_;
        state_ = State::Tensor;
      }
      return true;
    }
    return unexpected("an object");
  }
  bool key(std::string& k) {
    if (state_ == State::Root) {
      if (k.empty()) return fail("empty tensor name");
      if (!names_.insert(k).second)
        return fail(k == "__metadata__" ? "duplicate \"__metadata__\""
                                        : str_cat("duplicate tensor name '", printable(k), "'"));
      key_ = k;
      return true;
    }
    if (state_ == State::Meta) {
      if (metadata.count(k)) return fail(str_cat("duplicate __metadata__ key '", printable(k), "'"));
      key_ = k;
      return true;
    }
    if (state_ == State::Tensor) {
      Entry& e = entries.back();
      bool* seen = k == "dtype"          ? &e.has_dtype
                   : k == "shape"        ? &e.has_shape
                   : k == "data_offsets" ? &e.has_offsets
                                         : nullptr;
      if (!seen) return fail(str_cat("unknown field '", printable(k), "' (expected dtype, shape, data_offsets)"));
      if (*seen) return fail(str_cat("duplicate field '", k, "'"));
      *seen = true;
      field_ = k;
      return true;
    }
    return unexpected("a key");
  }
  bool end_object() {
    if (state_ == State::Tensor) {
      const Entry& e = entries.back();
      if (!e.has_dtype || !e.has_shape || !e.has_offsets)
        return fail("missing field (dtype, shape and data_offsets are all required)");
      state_ = State::Root;
      return true;
    }
    if (state_ == State::Meta) {
      state_ = State::Root;
      return true;
    }
    if (state_ == State::Root) {
      state_ = State::Done;
      return true;
    }
    return unexpected("the end of an object");
  }
  bool start_array(std::size_t) {
    if (state_ == State::Tensor && field_ == "shape") {
      state_ = State::Shape;
      return true;
    }
    if (state_ == State::Tensor && field_ == "data_offsets") {
      state_ = State::Offsets;
      return true;
    }
    return unexpected("an array");
  }
  bool end_array() {
    if (state_ == State::Shape || state_ == State::Offsets) {
      state_ = State::Tensor;
      return true;
    }
    return unexpected("the end of an array");
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) {
    if (error.empty()) error = str_cat("invalid JSON header at byte ", position, ": ", ex.what());
    return false;
  }

 private:
  enum class State { Start, Root, Meta, Tensor, Shape, Offsets, Done };

  bool fail(const std::string& what) {
    if (!error.empty()) return false;
    if (state_ == State::Tensor || state_ == State::Shape || state_ == State::Offsets)
      error = str_cat("tensor '", printable(entries.back().name), "': ", what);
    else
      error = what;
    return false;
  }
  bool unexpected(const char* what) {
    switch (state_) {
      case State::Start:
        return fail(str_cat("the header must be a JSON object, not ", what));
      case State::Root:
        return fail(key_ == "__metadata__" ? str_cat("__metadata__ must be an object, not ", what)
                                           : str_cat("tensor '", printable(key_), "' must be an object, not ", what));
      case State::Meta:
        return fail(str_cat("__metadata__ value '", printable(key_), "' must be a string, not ", what));
      case State::Tensor:
        return fail(str_cat("unexpected ", what, " for field '", field_, "'"));
      case State::Shape:
      case State::Offsets:
        return fail(str_cat("unexpected ", what, " in ", field_));
      case State::Done:
        break;
    }
    return fail(str_cat("unexpected ", what, " after the header object"));
  }

  State state_ = State::Start;
  std::string key_;    // the current top-level or metadata key
  std::string field_;  // the current field of a tensor entry
  std::unordered_set<std::string> names_;
};

struct ParsedSt {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t header_len = 0;
  NamedTensors tensors;
};

// Parses and validates a safetensors file in memory; allocates the tensors when load_data.
ParsedSt parse_st(const uint8_t* data, size_t size, const std::string& origin, const char* op, bool load_data,
                  const ReadOptions& options = {}) {
  detail::reset_parse_stats(size);
  auto fail = [&](const std::string& what) { throw Error(op, str_cat("'", origin, "': ", what)); };
  if (size < 8) fail(str_cat("file is ", size, " bytes, too short for a safetensors file (truncated?)"));
  uint64_t n;
  std::memcpy(&n, data, 8);
  if (n > kMaxSafetensorsHeader)
    fail(str_cat("header length ", n, " exceeds the cap of ", kMaxSafetensorsHeader, " bytes"));
  if (n > size - 8) fail(str_cat("header length ", n, " exceeds the ", size - 8, " bytes after it (truncated?)"));
  if (n < 2) fail(str_cat("header length ", n, " is too short for a JSON object"));
  const uint8_t* header = data + 8;
  const uint8_t* section = header + n;
  const uint64_t data_size = size - 8 - n;

  HeaderSax sax;
  bool ok = false;
  try {
    ok = json::sax_parse(header, header + n, &sax);
  } catch (const json::exception& e) {
    if (sax.error.empty()) sax.error = str_cat("invalid JSON header: ", e.what());
  }
  if (!ok) fail(sax.error.empty() ? std::string("invalid JSON header") : sax.error);

  ParsedSt out;
  out.header_len = n;
  for (Entry& e : sax.entries) {
    auto efail = [&](const std::string& what) { fail(str_cat("tensor '", printable(e.name), "': ", what)); };
    if (!st_dtype_from_name(e.dtype_text, &e.dtype))
      efail(str_cat("unsupported dtype '", printable(e.dtype_text), "' (supported: F32, F64, I64, BOOL)"));
    if (e.offsets.size() != 2) efail("data_offsets must have exactly 2 entries");
    const uint64_t begin = e.offsets[0], end = e.offsets[1];
    if (begin > end) efail(str_cat("data_offsets [", begin, ", ", end, "] are reversed"));
    if (end > data_size)
      efail(str_cat("data_offsets [", begin, ", ", end, "] run past the ", data_size, "-byte data section (truncated?)"));
    uint64_t nbytes = dtype_size(e.dtype);
    for (int64_t d : e.shape)
      if (__builtin_mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes))
        efail(str_cat("shape ", e.shape, " overflows 64 bits in bytes"));
    if (nbytes != end - begin)
      efail(str_cat("shape ", e.shape, " ", e.dtype_text, " needs ", nbytes, " bytes but data_offsets [", begin, ", ", end,
                "] span ", end - begin));
    e.nbytes = nbytes;
  }
  // The tensors must tile the data section: sorted by offsets, each starts where the previous ended.
  std::vector<size_t> order(sax.entries.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return sax.entries[a].offsets < sax.entries[b].offsets; });
  uint64_t expected = 0;
  const Entry* prev = nullptr;
  for (size_t i : order) {
    const Entry& e = sax.entries[i];
    if (e.offsets[0] < expected)
      fail(str_cat("tensor '", printable(e.name), "' overlaps tensor '", printable(prev->name), "' in the data section"));
    if (e.offsets[0] > expected)
      fail(str_cat("gap of ", e.offsets[0] - expected, " bytes in the data section before tensor '", printable(e.name),
               "'"));
    expected = e.offsets[1];
    prev = &e;
  }
  if (expected != data_size)
    fail(str_cat("the tensors cover ", expected, " bytes but the data section has ", data_size, " (trailing bytes)"));

  if (load_data) {
    for (const Entry& e : sax.entries) {
      const uint8_t* src = section + e.offsets[0];
      if (e.dtype == kBool)
        for (uint64_t j = 0; j < e.nbytes; ++j)
          if (src[j] > 1)
            fail(str_cat("tensor '", printable(e.name), "': bool element ", j, " has byte value ", int{src[j]},
                     " (must be 0 or 1)"));
      detail::note_allocation(e.nbytes);
      Tensor t = empty(e.shape, {.dtype = e.dtype});
      if (e.nbytes) std::memcpy(t.raw_data(), src, e.nbytes);
      if (!options.allow_nonfinite) detail::check_finite(t, e.name, origin, op);
      out.tensors.emplace_back(e.name, std::move(t));
    }
  }
  out.entries = std::move(sax.entries);
  out.metadata = std::move(sax.metadata);
  return out;
}

}  // namespace

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const char* op = "write_safetensors";
  std::unordered_set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    ATTO_CHECK(!name.empty(), op, "'", path, "': a tensor has an empty name");
    ATTO_CHECK(name != "__metadata__", op, "'", path, "': \"__metadata__\" cannot name a tensor");
    ATTO_CHECK(seen.insert(name).second, op, "'", path, "': tensor name '", name, "' appears more than once");
    ATTO_CHECK(t.defined(), op, "'", path, "': tensor '", name, "' is undefined");
    ATTO_CHECK(t.dim() <= kMaxRank, op, "'", path, "': tensor '", name, "' has rank ", t.dim(), " > ", kMaxRank);
  }
  // Data layout: largest elements first, then by name, so every tensor is aligned to its element size.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const size_t sa = dtype_size(tensors[a].second.dtype()), sb = dtype_size(tensors[b].second.dtype());
    return sa != sb ? sa > sb : tensors[a].first < tensors[b].first;
  });
  json header = json::object();
  uint64_t offset = 0;
  for (size_t i : order) {
    const auto& [name, t] = tensors[i];
    header[name] = {
        {"dtype", st_dtype_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    throw Error(op, str_cat("'", path, "': cannot encode the header (names and metadata must be UTF-8): ", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();

  detail::AtomicFile file(path, op);
  std::streambuf* out = file.stream().rdbuf();
  out->sputn(reinterpret_cast<const char*>(&n), 8);
  out->sputn(text.data(), static_cast<std::streamsize>(text.size()));
  file.flush_midway();
  for (size_t i : order) {
    const Tensor& t = tensors[i].second;
    if (t.nbytes()) out->sputn(static_cast<const char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes()));
  }
  file.commit();
}

SafeTensors parse_safetensors_from_memory(const uint8_t* data, size_t size, const std::string& origin) {
  ParsedSt p = parse_st(data, size, origin, "read_safetensors", true, {.allow_nonfinite = true});
  return SafeTensors{std::move(p.tensors), std::move(p.metadata)};
}

SafeTensors read_safetensors(const std::string& path) {
  std::vector<uint8_t> bytes = detail::read_file(path, "read_safetensors");
  return parse_safetensors_from_memory(bytes.data(), bytes.size(), path);
}

void export_safetensors(const nn::Module& m, const std::string& path,
                        const std::map<std::string, std::string>& metadata) {
  write_safetensors(path, state_dict(m), metadata);
}

LoadReport import_safetensors(nn::Module& m, const std::string& path, bool strict,
                              const std::vector<std::pair<std::string, std::string>>& rename,
                              const ReadOptions& options) {
  std::vector<uint8_t> bytes = detail::read_file(path, "import_safetensors");
  ParsedSt p = parse_st(bytes.data(), bytes.size(), path, "import_safetensors", true, options);
  bytes = {};
  for (auto& [name, _] : p.tensors)
    for (const auto& [from, to] : rename)
      if (name.compare(0, from.size(), from) == 0) {
        name = to + name.substr(from.size());
        break;
      }
  return detail::load_into(m, p.tensors, strict, "'" + path + "'", "import_safetensors");
}

namespace detail {

FileInfo inspect_safetensors_memory(const uint8_t* data, size_t size, const std::string& origin) {
  ParsedSt p = parse_st(data, size, origin, "inspect", false);
  FileInfo info;
  info.kind = "safetensors";
  info.metadata = json(p.metadata).dump();
  for (const Entry& e : p.entries) {
    const uint64_t offset = 8 + p.header_len + e.offsets[0];
    info.tensors.push_back(
        {e.name, e.dtype, e.shape, e.nbytes, offset, count_nonfinite(data + offset, e.dtype, e.nbytes)});
  }
  info.file_size = size;
  return info;
}

}  // namespace detail
}  // namespace attograd::io
