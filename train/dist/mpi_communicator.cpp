// The MPI communicator (library attograd_mpi). The fixed-order sum of a bucket of n floats over N ranks: the bucket is
// cut into N chunks; MPI_Alltoallv gives rank r chunk r of every rank, rank r adds them in rank order
// (ordered_sum), and MPI_Allgatherv gives every rank every summed chunk. That moves as many bytes as a ring
// reduce-scatter + all-gather (2 (N-1)/N n floats out of each rank), and the sum of every element is
// ((x0 + x1) + x2) + ..., whatever algorithm MPI picks for the two collectives (they only move bytes).

#include <mpi.h>

#include <chrono>
#include <cstring>

#include "autograd/error.h"
#include "train/dist/mpi.h"

namespace attograd::dist {

namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error("mpi", str_cat(what, " failed: ", std::string(text, static_cast<size_t>(len))));
}

class MpiWorld final : public Communicator {
 public:
  explicit MpiWorld(const MpiOptions& options) : options_(options) {
    ATTO_CHECK(options_.bucket_floats >= 1, "mpi_world", "bucket size must be >= 1 float, got ",
               options_.bucket_floats);
    int initialized = 0;
    MPI_Initialized(&initialized);
    ATTO_CHECK(!initialized, "mpi_world", "MPI is already initialised (one mpi_world per process)");
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    // Errors come back as codes (and become attograd::Error) instead of aborting inside MPI.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<size_t>(len));
    if (const size_t cut = v.find_first_of(",\n"); cut != std::string::npos) v.resize(cut);
    name_ = "MPI (" + v + ")";
  }
  ~MpiWorld() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  void allreduce_sum(float* data, int64_t n, ReduceOrder order) override {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t at = 0; at < n; at += options_.bucket_floats) {
      const int64_t m = std::min(options_.bucket_floats, n - at);
      if (order == ReduceOrder::Any)
        check(MPI_Allreduce(MPI_IN_PLACE, data + at, static_cast<int>(m), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
              "MPI_Allreduce");
      else
        fixed_bucket(data + at, m);
    }
    reduced_floats_ += n;
    reduce_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  std::vector<std::string> allgather(const std::string& bytes) override {
    const int mine = static_cast<int>(bytes.size());
    std::vector<int> sizes(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    check(MPI_Allgather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[static_cast<size_t>(r)] = total;
      total += sizes[static_cast<size_t>(r)];
    }
    std::string all(static_cast<size_t>(total), '\0');
    check(
        MPI_Allgatherv(bytes.data(), mine, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE, MPI_COMM_WORLD),
        "MPI_Allgatherv");
    std::vector<std::string> out;
    out.reserve(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r)
      out.push_back(all.substr(static_cast<size_t>(displs[static_cast<size_t>(r)]),
                               static_cast<size_t>(sizes[static_cast<size_t>(r)])));
    return out;
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  // The fixed-order sum of one bucket (see the file comment).
  void fixed_bucket(float* data, int64_t m) {
    const auto n = static_cast<size_t>(size_);
    counts_.assign(n, 0);
    displs_.assign(n, 0);
    for (int r = 0; r < size_; ++r) {  // chunk r: [r m / N, (r + 1) m / N)
      const int64_t lo = static_cast<int64_t>(r) * m / size_, hi = static_cast<int64_t>(r + 1) * m / size_;
      displs_[static_cast<size_t>(r)] = static_cast<int>(lo);
      counts_[static_cast<size_t>(r)] = static_cast<int>(hi - lo);
    }
    const int mine = counts_[static_cast<size_t>(rank_)];
    recv_.resize(n * static_cast<size_t>(mine));
    recv_counts_.assign(n, mine);
    recv_displs_.resize(n);
    for (size_t r = 0; r < n; ++r) recv_displs_[r] = static_cast<int>(r) * mine;
    check(MPI_Alltoallv(data, counts_.data(), displs_.data(), MPI_FLOAT, recv_.data(), recv_counts_.data(),
                        recv_displs_.data(), MPI_FLOAT, MPI_COMM_WORLD),
          "MPI_Alltoallv");
    parts_.resize(n);
    for (size_t r = 0; r < n; ++r) parts_[r] = recv_.data() + r * static_cast<size_t>(mine);
    ordered_sum(parts_, mine, data + displs_[static_cast<size_t>(rank_)]);
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts_.data(), displs_.data(), MPI_FLOAT,
                         MPI_COMM_WORLD),
          "MPI_Allgatherv");
  }

  MpiOptions options_;
  int rank_ = 0, size_ = 1;
  std::string name_;
  std::vector<int> counts_, displs_, recv_counts_, recv_displs_;  // scratch, reused every call
  std::vector<float> recv_;
  std::vector<const float*> parts_;
};

}  // namespace

std::shared_ptr<Communicator> mpi_world(const MpiOptions& options) { return std::make_shared<MpiWorld>(options); }

}  // namespace attograd::dist
