// The communicator's shared parts: the fixed-order sum, agreeing on errors, the launcher's world size and the
// build id.

#include "train/dist/communicator.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "autograd/error.h"

namespace attograd::dist {

ReduceOrder parse_reduce_order(const std::string& name) {
  if (name == "fixed") return ReduceOrder::Fixed;
  if (name == "any") return ReduceOrder::Any;
  throw Error("parse_reduce_order", str_cat("the reduction order must be fixed or any, got \"", name, "\""));
}

std::string to_string(ReduceOrder order) { return order == ReduceOrder::Fixed ? "fixed" : "any"; }

std::vector<uint64_t> Communicator::allgather_u64(uint64_t value) {
  std::string bytes(sizeof value, '\0');
  std::memcpy(bytes.data(), &value, sizeof value);
  const std::vector<std::string> all = allgather(bytes);
  std::vector<uint64_t> out(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    ATTO_CHECK(all[r].size() == sizeof value, "allgather_u64", "rank ", r, " sent ", all[r].size(), " bytes, not 8");
    std::memcpy(&out[r], all[r].data(), sizeof value);
  }
  return out;
}

std::vector<double> Communicator::allgather_f64(const std::vector<double>& values) {
  std::string bytes(values.size() * sizeof(double), '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  const std::vector<std::string> all = allgather(bytes);
  std::vector<double> out;
  out.reserve(all.size() * values.size());
  for (size_t r = 0; r < all.size(); ++r) {
    ATTO_CHECK(all[r].size() == bytes.size(), "allgather_f64", "rank ", r, " sent ", all[r].size() / sizeof(double),
               " values, rank ", rank(), " ", values.size());
    const size_t at = out.size();
    out.resize(at + values.size());
    if (!values.empty()) std::memcpy(out.data() + at, all[r].data(), bytes.size());
  }
  return out;
}

void Communicator::agree(const std::string& op, const std::string& error) {
  const std::vector<std::string> all = allgather(error);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    set_failed_together();
    throw Error(op, size() > 1 ? str_cat("rank ", r, ": ", all[r]) : all[r]);
  }
}

void SingleProcess::allreduce_sum(float*, int64_t n, ReduceOrder) { reduced_floats_ += n; }

void SingleProcess::abort(int code) { std::_Exit(code); }

void ordered_sum(const std::vector<const float*>& parts, int64_t n, float* out) {
  ATTO_CHECK(!parts.empty(), "ordered_sum", "no parts to sum");
  if (out != parts[0]) std::memcpy(out, parts[0], static_cast<size_t>(n) * sizeof(float));
  for (size_t r = 1; r < parts.size(); ++r) {
    const float* p = parts[r];
    for (int64_t i = 0; i < n; ++i) out[i] += p[i];
  }
}

int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"}) {
    const char* v = std::getenv(var);
    if (v && *v) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  // PMIx (Open MPI 4/5 and Slurm) names the rank, not always the size: a rank means a launcher of at least one.
  if (const char* v = std::getenv("PMIX_RANK"); v && *v) return 1;
  return 0;
}

std::string build_id() {
  // ATTOGRAD_BUILD_ID_SALT stands in for a different binary in the tests (tests/train/dist/test_mpi.cpp).
  const char* salt = std::getenv("ATTOGRAD_BUILD_ID_SALT");
  return str_cat("attograd built ", __DATE__, " ", __TIME__, " by ",
#if defined(__clang__)
                 "clang ", __clang_version__
#elif defined(__GNUC__)
                 "gcc ", __VERSION__
#else
                 "an unknown compiler"
#endif
                 ,
                 " (float ", sizeof(float), ", pointer ", sizeof(void*), ")", salt ? salt : "");
}

}  // namespace attograd::dist
