#pragma once
// Saved weights and training checkpoints (attograd::io): one defensive, checksummed binary format.
//
// File layout (format version 1; every integer little-endian; written through cereal's portable binary
// archive, whose first byte is its own byte-order flag):
//
//   "ATTOGRAD"                      8-byte magic
//   u8   byte order               1 (cereal's flag: little-endian)
//   u32  format version            1
//   u32  kind                      0 = weights, 1 = checkpoint
//   str  metadata                  JSON text (e.g. the model configuration); "{}" when none
//   u64  tensor count, then per tensor:
//          str  name               dotted name ("blocks.0.self_attn.in_proj_weight"), unique, non-empty
//          u8   dtype              0 float32, 1 float64, 2 int64, 3 bool (one byte, 0 or 1)
//          u8   rank               0..8
//          i64  dims[rank]         each >= 0
//          raw  data               product(dims) * dtype size bytes, row-major
//   checkpoint only:
//     u64 generator count,  per generator: str name, u64 state, u64 inc     (GeneratorState)
//     u64 counter count,    per counter:   str name, i64 value
//     u64 scalar count,     per scalar:    str name, f64 value
//     str  metrics_csv
//   u64  checksum                  XXH64 (seed 0) of every byte before it
//
// where `str` is u64 length + bytes (cereal's own std::string layout). Module weights are the module's
// named_parameters() followed by its named_buffers(), under their dotted names in one namespace (as in a
// PyTorch state_dict: a buffer such as PositionalEncoding's "pe" sits beside the parameters).
//
// The loader never trusts a length. It reads the whole file (at most kMaxFileBytes), verifies the checksum,
// then parses from memory, checking every count, string length and product(shape) * dtype size
// (overflow-checked) against its cap and the bytes left before allocating anything; it rejects unknown dtypes,
// ranks > 8, negative dims, duplicate names, bool bytes other than 0/1 and trailing bytes. cereal reads the
// fixed-size fields and the raw data (and would swap bytes on a big-endian host), but never a length-prefixed
// field: cereal would allocate a hostile length before reading it, so lengths are read and checked here first.
// Every failure is an attograd::Error naming the file, the tensor (if any) and what was wrong.
//
// Values: the loaders of a model's or a run's state -- load, load_checkpoint and import_safetensors -- refuse a
// float tensor holding NaN or +-inf with an Error naming the file and the tensor, unless
// ReadOptions::allow_nonfinite: weights that are not finite make every output NaN. The check runs when a file is
// loaded, one pass over the bits next to the checksum's, never when one is saved (a checkpoint mid-training costs
// nothing more). The tensor-container readers (read_tensors, read_safetensors, parse_*_from_memory but the
// checkpoint's) return any values, as safetensors' load_file does; inspect() counts them (TensorInfo::nonfinite).
//
// Saves are atomic: the bytes go to a unique temporary file next to the target (mkstemp), which is flushed,
// fsync'ed and renamed over the target, then the directory is fsync'ed. On any failure the temporary file is
// removed and a previous file at the target is left intact. A save holds an exclusive flock on its temporary file;
// the next save of the same target removes the unlocked "<target>.tmp-XXXXXX" files that killed saves left.

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/random.h"
#include "autograd/tensor.h"
#include "nn/module.h"

namespace attograd::nn {
class Module;
}
namespace attograd::optim {
class Optimizer;
}

namespace attograd::io {

/// Tensors with names, in order (a state dict).
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

/// The magic at the start of every native file.
inline constexpr char kMagic[9] = "ATTOGRAD";
/// The format version this code writes (and the newest it reads).
inline constexpr uint32_t kFormatVersion = 1;
/// Largest file the loaders read (4 GiB).
inline constexpr uint64_t kMaxFileBytes = uint64_t{1} << 32;
/// Longest tensor, generator, counter or scalar name accepted.
inline constexpr uint64_t kMaxNameBytes = 1 << 16;
/// Highest tensor rank accepted.
inline constexpr int kMaxRank = 8;

/// Deepest nesting of arrays and objects accepted in JSON text: a file's metadata, a --config file.
inline constexpr int kMaxJsonDepth = 64;
/// The deepest nesting of arrays and objects in JSON text (a scan, without parsing or recursion).
int json_depth(const std::string& text);
/// Throws Error(op, ...) naming `origin` when the JSON text nests deeper than kMaxJsonDepth.
void check_json_depth(const std::string& text, const char* op, const std::string& origin);

/// What load() or load_state_dict() did not load, by name (Module::load_state_dict's result).
using LoadReport = nn::LoadStateDictResult;

/// How the file readers treat the values they read.
struct ReadOptions {
  /// Accept NaN and +-inf in float tensors. Default false: such a tensor is an Error naming it (weights that are
  /// not finite make every output NaN); true for a tool that looks at a broken file or tensors that hold them on
  /// purpose.
  bool allow_nonfinite = false;
};

/// m.state_dict(): the module's parameters (named_parameters()) followed by its buffers (named_buffers()); shares
/// data.
NamedTensors state_dict(const nn::Module& m);
/// m.load_state_dict(tensors, options) with `origin` naming the source in messages: copies `tensors` into m's
/// parameters and buffers in place (copy_). Strict by default: any missing, unexpected or mismatched tensor throws
/// ONE Error naming each, and nothing is copied; non-strict copies what matches and reports the rest. A float32 /
/// float64 difference is a mismatch unless options.allow_dtype_cast.
LoadReport load_state_dict(nn::Module& m, const NamedTensors& tensors, const nn::LoadStateDictOptions& options = {},
                           const std::string& origin = "state dict");

/// Saves m's state_dict() with `metadata_json` (must be valid JSON) to `path`, atomically.
void save(const nn::Module& m, const std::string& path, const std::string& metadata_json = "{}");
/// Loads a file written by save() into m in place (see load_state_dict for strict and non-strict). Files convert
/// float32 <-> float64 to the module's dtypes (allow_dtype_cast: a float64 file rounds into a float32 module).
/// Error naming the tensor when one holds NaN or +-inf (unless options.allow_nonfinite).
LoadReport load(nn::Module& m, const std::string& path, bool strict = true, const ReadOptions& options = {});

/// Writes named tensors (any dtype, unique non-empty names) and JSON metadata as a weights file, atomically.
void write_tensors(const std::string& path, const NamedTensors& tensors, const std::string& metadata_json = "{}");
/// Reads every tensor of a weights file, in file order (any values: NaN and +-inf too); stores the metadata JSON in
/// *metadata if given.
NamedTensors read_tensors(const std::string& path, std::string* metadata = nullptr);
/// Parses a weights file held in memory (as read_tensors; `origin` names it in errors).
NamedTensors parse_tensors_from_memory(const uint8_t* data, size_t size, std::string* metadata = nullptr,
                                       const std::string& origin = "<memory>");

/// Everything a training run needs to resume: model weights ("model.<name>"), optimizer state
/// ("optim.<name>"), step counts, generator states (init, dropout, data), schedule position and metrics.
struct Checkpoint {
  std::string metadata_json = "{}";                                ///< configuration, as JSON
  NamedTensors tensors;                                            ///< weights and optimizer state
  std::vector<std::pair<std::string, GeneratorState>> generators;  ///< e.g. "init", "dropout", "data"
  std::vector<std::pair<std::string, int64_t>> counters;           ///< e.g. "step", "epoch", "optim.step_count"
  std::vector<std::pair<std::string, double>> scalars;             ///< e.g. "lr", "best_val_loss"
  std::string metrics_csv;                                         ///< the metrics log so far

  /// The tensor with this name; throws an Error naming it if absent.
  const Tensor& tensor(const std::string& name) const;
  /// The generator state with this name; throws if absent.
  const GeneratorState& generator(const std::string& name) const;
  /// The counter with this name; throws if absent.
  int64_t counter(const std::string& name) const;
  /// The scalar with this name; throws if absent.
  double scalar(const std::string& name) const;
};

/// Writes a checkpoint to `path` in the native format (kind 1), atomically.
void save_checkpoint(const Checkpoint& checkpoint, const std::string& path);
/// Reads a checkpoint written by save_checkpoint(). Error naming the tensor when one (weights or optimizer state)
/// holds NaN or +-inf (unless options.allow_nonfinite); the scalars may hold any value.
Checkpoint load_checkpoint(const std::string& path, const ReadOptions& options = {});
/// Parses a checkpoint held in memory (as load_checkpoint).
Checkpoint parse_checkpoint_from_memory(const uint8_t* data, size_t size, const std::string& origin = "<memory>",
                                        const ReadOptions& options = {});

/// Appends m's state_dict() to the checkpoint's tensors as "<prefix><name>" (the tensors share m's data).
void add_module_state(Checkpoint& checkpoint, const nn::Module& m, const std::string& prefix = "model.");
/// Loads the checkpoint's "<prefix>*" tensors into m (as load(): names without the prefix, float dtypes convert).
LoadReport load_module_state(const Checkpoint& checkpoint, nn::Module& m, const std::string& prefix = "model.",
                             bool strict = true);
/// Appends the optimizer's state_tensors() as "<prefix><name>" and its step_count() as counter
/// "<prefix>step_count".
void add_optimizer_state(Checkpoint& checkpoint, const optim::Optimizer& opt, const std::string& prefix = "optim.");
/// Restores the optimizer from "<prefix>*" tensors and the "<prefix>step_count" counter (Optimizer::load_state).
void load_optimizer_state(const Checkpoint& checkpoint, optim::Optimizer& opt, const std::string& prefix = "optim.");

/// One tensor's entry as listed by inspect().
struct TensorInfo {
  std::string name;     ///< dotted name
  Dtype dtype;          ///< element type
  Shape shape;          ///< sizes
  uint64_t nbytes = 0;  ///< data size in bytes
  uint64_t offset = 0;  ///< byte offset of the data in the file
  int64_t nonfinite = 0;  ///< NaN or +-inf elements (float dtypes; counted by inspect)
};

/// What a file holds, read without a model (for `attograd inspect`).
struct FileInfo {
  std::string kind;                 ///< "weights", "checkpoint" or "safetensors"
  uint32_t format_version = 0;      ///< native format version (0 for safetensors)
  std::string metadata;             ///< metadata JSON (safetensors: its "__metadata__" object)
  std::vector<TensorInfo> tensors;  ///< every tensor, in file order
  std::vector<std::pair<std::string, GeneratorState>> generators;  ///< checkpoint generators
  std::vector<std::pair<std::string, int64_t>> counters;           ///< checkpoint counters
  std::vector<std::pair<std::string, double>> scalars;             ///< checkpoint scalars
  uint64_t metrics_csv_bytes = 0;                                  ///< size of the checkpoint's metrics log
  uint64_t file_size = 0;                                          ///< bytes in the file
  bool has_checksum = false;                                       ///< native files carry one; safetensors files do not
  bool checksum_ok = false;        ///< the stored checksum matches the bytes (native files)
  uint64_t stored_checksum = 0;    ///< as stored in the file
  uint64_t computed_checksum = 0;  ///< as computed from the bytes
  /// Total elements over all tensors.
  int64_t num_elements() const;
  /// A multi-line human-readable listing.
  std::string to_string() const;
};

/// Describes a native weights or checkpoint file, or a safetensors file, without loading it into a model.
/// A checksum mismatch is reported (checksum_ok = false), not thrown; a malformed structure throws; non-finite
/// values are counted (TensorInfo::nonfinite), not thrown.
FileInfo inspect(const std::string& path);
/// As inspect(), on bytes in memory.
FileInfo inspect_memory(const uint8_t* data, size_t size, const std::string& origin = "<memory>");

namespace detail {

/// Points at which a save can be made to fail, for tests (set_fault_point).
enum FaultPoint : int {
  kNoFault = 0,           ///< normal operation
  kFaultAfterOpen = 1,    ///< right after the temporary file is created
  kFaultMidWrite = 2,     ///< after the header has reached the temporary file, before the tensors
  kFaultBeforeFsync = 3,  ///< after every byte is written, before fsync
  kFaultBeforeRename = 4  ///< after fsync and close, before the rename over the target
};
/// Makes the next save on any thread throw at `stage` (a FaultPoint), once; kNoFault clears it. Test-only.
void set_fault_point(int stage);

/// Allocation statistics of the last parse on this thread (the corruption tests bound memory with them).
struct ParseStats {
  uint64_t input_bytes = 0;      ///< size of the parsed input
  uint64_t max_allocation = 0;   ///< largest single allocation sized by a value read from the input
  uint64_t total_allocated = 0;  ///< sum of those allocations
};
/// The statistics of the last parse (read_tensors, load_checkpoint, inspect, read_safetensors, ...) on this thread.
ParseStats last_parse_stats();
/// Starts a new statistics record for an input of `input_bytes`.
void reset_parse_stats(uint64_t input_bytes);
/// Records an allocation of `bytes` sized by input data.
void note_allocation(uint64_t bytes);

/// nn::detail::load_state_dict with `op` naming the operation in errors (load, import_safetensors, ...) and
/// float32 <-> float64 conversion allowed, as every file loader does.
LoadReport load_into(nn::Module& m, const NamedTensors& tensors, bool strict, const std::string& origin,
                     const char* op);

/// NaN or +-inf elements among the `nbytes` bytes of `dtype` values at `data` (any alignment, little-endian; 0 for
/// int64 and bool); the index of the first in *first when there is one.
int64_t count_nonfinite(const void* data, Dtype dtype, uint64_t nbytes, int64_t* first = nullptr);
/// Error(op, ...) naming `origin`, the tensor and its first non-finite value when t (the tensor `name` of the file)
/// holds NaN or +-inf.
void check_finite(const Tensor& t, const std::string& name, const std::string& origin, const char* op);

/// XXH64 of `size` bytes with `seed` (the format's checksum).
uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0);

/// Reads a whole regular file of at most `cap` bytes; errors name `op` and the path.
std::vector<uint8_t> read_file(const std::string& path, const char* op, uint64_t cap = kMaxFileBytes);

/// A file written atomically: bytes go to a unique temporary file next to `path`; commit() flushes, fsyncs and
/// renames it over `path`. Destroyed without commit() (an exception), it removes the temporary file.
class AtomicFile {
 public:
  /// Creates the temporary file; `op` names the operation in errors.
  AtomicFile(const std::string& path, const char* op);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  /// A binary stream into the temporary file (errors throw attograd::Error).
  std::ostream& stream();
  /// Writes n bytes (buffered); Error naming the file and errno when the system refuses them.
  void write(const void* data, size_t n);
  /// Pushes buffered bytes to the file (the kFaultMidWrite point).
  void flush_midway();
  /// XXH64 of every byte written so far.
  uint64_t digest();
  /// Flushes, fsyncs, closes and renames over the target, then fsyncs the directory.
  void commit();
  /// The temporary file's path.
  const std::string& temp_path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace detail
}  // namespace attograd::io
