#pragma once
// safetensors interop (the format PyTorch's `safetensors` package and Hugging Face use):
//
//   u64 N (little-endian) | N bytes of UTF-8 JSON header | data section
//   header: {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"<key>": "<string value>", ...}}
//
// Offsets are relative to the start of the data section; the tensors cover it exactly, without gaps or
// overlaps. Supported dtypes: F32, F64, I64 and BOOL (others, e.g. F16 or BF16, are rejected by name).
//
// The writer pads the header with spaces to a multiple of 8 bytes and lays the data out by element size
// (largest first), then by name, so every tensor starts at an offset aligned to its element size (as the
// reference writer does). The reader is as defensive as the native loader (train/io/serialize.h): it bounds N
// (kMaxSafetensorsHeader and the file size), parses the header with a streaming (SAX) parser that accepts only
// the structure above (no nesting beyond it, rank <= 8, no duplicate names or fields), checks every dtype,
// shape and offset pair and product(shape) * size (overflow-checked) against the data section, and requires
// exact coverage, all before allocating any tensor.
//
// Module names: our named_parameters() names are PyTorch's for Linear, LayerNorm, Embedding,
// MultiheadAttention (in_proj_weight, in_proj_bias, out_proj.weight, ...) and the Transformer layers, so a
// PyTorch state_dict saved as safetensors imports directly; `rename` maps other prefixes.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "train/io/serialize.h"

namespace attograd::io {

/// Largest safetensors JSON header accepted (100 MB).
inline constexpr uint64_t kMaxSafetensorsHeader = 100ull << 20;

/// The contents of a safetensors file.
struct SafeTensors {
  NamedTensors tensors;                         ///< in header order
  std::map<std::string, std::string> metadata;  ///< the "__metadata__" object (string values)
};

/// Writes tensors (F32, F64, I64, BOOL; unique non-empty names other than "__metadata__") and string metadata
/// as a safetensors file, atomically (as io::save).
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});
/// Reads a safetensors file (any values: NaN and +-inf too, as safetensors' load_file).
SafeTensors read_safetensors(const std::string& path);
/// Parses a safetensors file held in memory (`origin` names it in errors).
SafeTensors parse_safetensors_from_memory(const uint8_t* data, size_t size, const std::string& origin = "<memory>");

/// Writes m's state_dict() (parameters, then buffers, PyTorch's names) as safetensors.
void export_safetensors(const nn::Module& m, const std::string& path,
                        const std::map<std::string, std::string>& metadata = {});
/// Loads a safetensors file (e.g. a PyTorch state_dict) into m in place, as io::load: strict by default
/// (one Error naming every missing, unexpected and mismatched tensor), float32 <-> float64 converted.
/// `rename` maps name prefixes of the file to ours ({{"encoder.layers.", "layers."}}), first match wins. Error naming
/// the tensor when one holds NaN or +-inf (unless options.allow_nonfinite).
LoadReport import_safetensors(nn::Module& m, const std::string& path, bool strict = true,
                              const std::vector<std::pair<std::string, std::string>>& rename = {},
                              const ReadOptions& options = {});

namespace detail {
/// inspect() for safetensors bytes: lists the tensors without allocating them.
FileInfo inspect_safetensors_memory(const uint8_t* data, size_t size, const std::string& origin);
}  // namespace detail

}  // namespace attograd::io
