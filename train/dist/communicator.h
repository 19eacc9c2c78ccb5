#pragma once
// Data-parallel training (attograd::dist): what a Trainer needs from the processes it trains with. A Communicator
// is one rank of a fixed group of processes; the Trainer uses it to sum gradients, agree on the configuration and
// compare parameter hashes (docs/DISTRIBUTED.md). SingleProcess (a group of one) is always built; the MPI
// communicator (train/dist/mpi.h) is built only when CMake finds MPI and lives in the separate library
// attograd_mpi, so that no public header names MPI.
//
// The determinism promise: allreduce_sum(..., ReduceOrder::Fixed) adds the ranks' values in rank order,
// ((x0 + x1) + x2) + ..., starting from a copy of x0, on every rank and whatever the transport. That is the order in
// which a single process with grad_accum = N adds its N micro-batch gradients, so N ranks give bit for bit the
// weights of one process with --grad-accum N.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace attograd::dist {

/// How allreduce_sum adds the ranks' values.
enum class ReduceOrder {
  Fixed,  ///< in rank order, ((x0 + x1) + x2) + ...: bitwise reproducible, equal to grad accumulation
  Any,    ///< the transport's own order (MPI_Allreduce): possibly faster, reproducible only to rounding
};

/// Parses "fixed" or "any" (Error naming the value otherwise).
ReduceOrder parse_reduce_order(const std::string& name);
/// "fixed" or "any".
std::string to_string(ReduceOrder order);

/// One setting the ranks must agree on before they train together (see agree_on_settings).
struct Setting {
  std::string name;        ///< as the user sets it: "--bucket-mb", "the build"
  std::string value;       ///< what the ranks compare, exactly
  std::string shown = {};  ///< how an error shows this rank's value (empty: value)
};

/// One rank of a group of processes that train one model together.
class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This process's rank in [0, size()).
  virtual int rank() const = 0;
  /// The number of processes.
  virtual int size() const = 0;
  /// "single process" or "MPI (Open MPI ...)".
  virtual std::string name() const = 0;
  /// Replaces data[0..n) on every rank by the sum over ranks (see ReduceOrder); collective.
  virtual void allreduce_sum(float* data, int64_t n, ReduceOrder order) = 0;
  /// Starts allreduce_sum of data[0..n), which must stay untouched until wait_all(); collective: every rank starts
  /// the same reductions in the same order. The default sums at once.
  virtual void start_allreduce_sum(float* data, int64_t n, ReduceOrder order) { allreduce_sum(data, n, order); }
  /// Advances the reductions started (called between the backward's ops, so that they progress meanwhile).
  virtual void progress() {}
  /// Completes every reduction started.
  virtual void wait_all() {}
  /// Every rank's bytes, indexed by rank; collective.
  virtual std::vector<std::string> allgather(const std::string& bytes) = 0;
  /// Ends every process of the group at once with `code` (for an error only this rank saw).
  [[noreturn]] virtual void abort(int code) = 0;
  /// The transport's own settings that every rank must share (agree_on_settings compares them): none by default.
  virtual std::vector<Setting> protocol_settings() const { return {}; }

  /// Every rank's value, indexed by rank; collective.
  std::vector<uint64_t> allgather_u64(uint64_t value);
  /// Every rank's values (the same count on every rank), concatenated in rank order; collective.
  std::vector<double> allgather_f64(const std::vector<double>& values);
  /// Raises on every rank the first error any rank had: `error` is this rank's message ("" when it had none). When
  /// some rank had one, every rank throws Error(op, "rank R: <message>") for the lowest such R, after marking
  /// failed_together(); collective.
  void agree(const std::string& op, const std::string& error);
  /// Marks that every rank is throwing the same error (so that each may end normally instead of aborting).
  void set_failed_together() { failed_together_ = true; }
  /// Whether the error in flight was raised on every rank alike (by agree() or a check every rank made).
  bool failed_together() const { return failed_together_; }
  /// Seconds spent in allreduce_sum, start_allreduce_sum, progress and wait_all so far (the time they block).
  double reduce_seconds() const { return reduce_seconds_; }
  /// Floats summed by allreduce_sum so far.
  int64_t reduced_floats() const { return reduced_floats_; }

 protected:
  double reduce_seconds_ = 0;   ///< for the subclasses' allreduce_sum
  int64_t reduced_floats_ = 0;  ///< likewise

 private:
  bool failed_together_ = false;
};

/// Checks that every rank holds the same settings (the same names with the same values, in the same order);
/// collective. When they differ, every rank raises, alike (failed_together()), Error(op, "ranks disagree on NAME:
/// rank 0 has A, rank 2 has B") for the first setting that differs (naming every rank whose value is not rank 0's).
/// Its exchanges have fixed sizes and do not depend on the settings: an allgather of one digest of all of them
/// and, only when those differ, of the per-setting digests, 64 at a time, then of the first differing setting's
/// name and value (cut to 200 characters). So ranks that disagree on how to communicate still meet here, and the
/// call ends in a bounded number of collectives.
void agree_on_settings(Communicator& comm, const std::string& op, const std::vector<Setting>& settings);

/// A group of one process: the sum is the value itself.
class SingleProcess final : public Communicator {
 public:
  /// Rank 0 of 1.
  int rank() const override { return 0; }
  /// 1.
  int size() const override { return 1; }
  /// "single process".
  std::string name() const override { return "single process"; }
  /// Leaves data as it is.
  void allreduce_sum(float* data, int64_t n, ReduceOrder order) override;
  /// {bytes}.
  std::vector<std::string> allgather(const std::string& bytes) override { return {bytes}; }
  /// std::_Exit(code).
  [[noreturn]] void abort(int code) override;
};

/// out[0..n) = ((parts[0] + parts[1]) + parts[2]) + ... (the first a copy; out may alias parts[0]): the fixed-order
/// sum every ReduceOrder::Fixed reduction uses.
void ordered_sum(const std::vector<const float*>& parts, int64_t n, float* out);

/// The number of processes the launcher (mpirun, srun, mpiexec) started, from its environment variables
/// (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX / Slurm); 0 when this process was not started by an MPI launcher.
int launcher_world_size();

/// An identifier of this build of the library (compiler, date and time of compilation), which the ranks compare so
/// that different binaries do not train together.
std::string build_id();

}  // namespace attograd::dist
