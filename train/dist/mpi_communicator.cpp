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
    // The nonblocking reductions' two stages run on communicators of their own, each in bucket order on every rank
    // (MPI matches the collectives of one communicator by the order in which they start).
    check(MPI_Comm_dup(MPI_COMM_WORLD, &first_stage_), "MPI_Comm_dup");
    check(MPI_Comm_dup(MPI_COMM_WORLD, &second_stage_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(first_stage_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(second_stage_, MPI_ERRORS_RETURN);
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
    if (finalized) return;
    MPI_Comm_free(&first_stage_);
    MPI_Comm_free(&second_stage_);
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  void start_allreduce_sum(float* data, int64_t n, ReduceOrder order) override {
    const Timer timer(this);
    Pending& p = next_pending();
    p.data = data;
    p.m = n;
    p.order = order;
    reduced_floats_ += n;
    if (order == ReduceOrder::Any) {
      p.stage = 2;
      check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, first_stage_, &p.request),
            "MPI_Iallreduce");
      return;
    }
    p.stage = 1;
    cut(n, p.counts, p.displs);
    const int mine = p.counts[static_cast<size_t>(rank_)];
    const auto ranks = static_cast<size_t>(size_);
    p.recv.resize(ranks * static_cast<size_t>(mine));
    p.recv_counts.assign(ranks, mine);
    p.recv_displs.resize(ranks);
    for (size_t r = 0; r < ranks; ++r) p.recv_displs[r] = static_cast<int>(r) * mine;
    check(MPI_Ialltoallv(data, p.counts.data(), p.displs.data(), MPI_FLOAT, p.recv.data(), p.recv_counts.data(),
                         p.recv_displs.data(), MPI_FLOAT, first_stage_, &p.request),
          "MPI_Ialltoallv");
  }

  void progress() override {
    const Timer timer(this);
    // In order, and no further than the first reduction still in its first stage: the second stages start in
    // bucket order too.
    for (size_t i = 0; i < used_; ++i) {
      advance(pending_[i], false);
      if (pending_[i].stage == 1) break;
    }
  }

  void wait_all() override {
    const Timer timer(this);
    for (size_t i = 0; i < used_; ++i) advance(pending_[i], true);
    used_ = 0;
  }

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

  std::vector<Setting> protocol_settings() const override {
    return {{.name = "the MPI library", .value = name_},
            {.name = "MpiOptions::bucket_floats", .value = std::to_string(options_.bucket_floats)}};
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

  // One reduction in flight: stage 1 the all-to-all of the fixed order, stage 2 the all-gather (or the
  // MPI_Iallreduce of ReduceOrder::Any), 0 done. Kept between steps, so that their buffers are reused.
  struct Pending {
    float* data = nullptr;
    int64_t m = 0;
    ReduceOrder order = ReduceOrder::Fixed;
    int stage = 0;
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<int> counts, displs, recv_counts, recv_displs;
    std::vector<float> recv;
    std::vector<const float*> parts;
  };

  // Adds the time spent in a call to reduce_seconds_.
  struct Timer {
    explicit Timer(MpiWorld* w) : w(w), start(std::chrono::steady_clock::now()) {}
    ~Timer() { w->reduce_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
    MpiWorld* w;
    std::chrono::steady_clock::time_point start;
  };

  Pending& next_pending() {
    if (used_ == pending_.size()) pending_.emplace_back();
    return pending_[used_++];
  }

  // Chunk r of m floats: [r m / N, (r + 1) m / N).
  void cut(int64_t m, std::vector<int>& counts, std::vector<int>& displs) const {
    const auto n = static_cast<size_t>(size_);
    counts.assign(n, 0);
    displs.assign(n, 0);
    for (int r = 0; r < size_; ++r) {
      const int64_t lo = static_cast<int64_t>(r) * m / size_, hi = static_cast<int64_t>(r + 1) * m / size_;
      displs[static_cast<size_t>(r)] = static_cast<int>(lo);
      counts[static_cast<size_t>(r)] = static_cast<int>(hi - lo);
    }
  }

  // Moves a reduction on when its current stage has completed (or waits for it, when `block`).
  void advance(Pending& p, bool block) {
    while (p.stage != 0) {
      int done = 0;
      if (block)
        check(MPI_Wait(&p.request, MPI_STATUS_IGNORE), "MPI_Wait"), done = 1;
      else
        check(MPI_Test(&p.request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (!done) return;
      if (p.stage == 2) {
        p.stage = 0;
        return;
      }
      // The all-to-all is done: add this rank's chunk of every rank in rank order, then gather the sums.
      const int mine = p.counts[static_cast<size_t>(rank_)];
      p.parts.resize(static_cast<size_t>(size_));
      for (size_t r = 0; r < p.parts.size(); ++r) p.parts[r] = p.recv.data() + r * static_cast<size_t>(mine);
      ordered_sum(p.parts, mine, p.data + p.displs[static_cast<size_t>(rank_)]);
      p.stage = 2;
      check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p.data, p.counts.data(), p.displs.data(), MPI_FLOAT,
                            second_stage_, &p.request),
            "MPI_Iallgatherv");
    }
  }

  MpiOptions options_;
  MPI_Comm first_stage_ = MPI_COMM_NULL, second_stage_ = MPI_COMM_NULL;
  std::vector<Pending> pending_;  // the first used_ are in flight (a vector: references stay valid between calls)
  size_t used_ = 0;
  int rank_ = 0, size_ = 1;
  std::string name_;
  std::vector<int> counts_, displs_, recv_counts_, recv_displs_;  // scratch, reused every call
  std::vector<float> recv_;
  std::vector<const float*> parts_;
};

}  // namespace

std::shared_ptr<Communicator> mpi_world(const MpiOptions& options) { return std::make_shared<MpiWorld>(options); }

}  // namespace attograd::dist
