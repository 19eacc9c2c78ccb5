// Data-parallel training across processes through MpiCommunicator (train/dist/mpi_communicator.cpp, the library
// attograd_mpi): tests/train/dist/dist_worker.cpp and the `attograd` tool started under
// mpirun (ctest label mpi). The proofs that N processes equal one (within float tolerance against one process, bit
// for bit against one process with grad_accum N, run to run, across a resume), and the faults: a diverged replica,
// a killed rank, a batch not divisible by the ranks, ranks that disagree on any setting (MpiAgreement), a rank that
// cannot read its checkpoint. Skips when the build has no MPI (scripts/test installs Open MPI, so CI runs them).

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

#if ATTOGRAD_HAS_MPI
constexpr const char* kWorker = ATTOGRAD_DIST_WORKER;
constexpr const char* kMpiexec = ATTOGRAD_MPIEXEC;
#endif

struct Proc {
  int status = -1;
  std::string out, err;
  double seconds = 0;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Mpi : public ::testing::Test {
 protected:
  void SetUp() override {
#if !ATTOGRAD_HAS_MPI
    GTEST_SKIP() << "this build has no MPI (install libopenmpi-dev and reconfigure)";
#else
    // What Open MPI needs in a container: running as root, more ranks than cores, no cross-memory attach.
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    ::setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
    ::setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
    // In the sanitizer build (.ci/run), the processes under mpirun run without LeakSanitizer: Open MPI keeps
    // allocations past MPI_Finalize in plugins it unloads there, which LeakSanitizer can neither attribute nor
    // suppress ("<unknown module>"). AddressSanitizer and UBSan stay on; test_dist.cpp checks the Trainer's
    // data-parallel code for leaks in one process.
    const char* asan = std::getenv("ASAN_OPTIONS");
    if (!asan || !std::string(asan).ends_with(":detect_leaks=0"))
      ::setenv("ASAN_OPTIONS", (asan ? std::string(asan) + ":detect_leaks=0" : std::string("detect_leaks=0")).c_str(),
               1);
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / (std::string("attograd_mpi_") + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
#endif
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Runs a shell command under `timeout` (a hang fails instead of blocking the suite), capturing its output.
  Proc shell(const std::string& cmd, int timeout_s = 120) {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string full = "cd '" + dir_.string() + "' && timeout -k 5 " + std::to_string(timeout_s) + " " + cmd +
                             " >'" + out.string() + "' 2>'" + err.string() + "' </dev/null";
    const auto start = std::chrono::steady_clock::now();
    const int st = std::system(full.c_str());
    Proc r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

#if ATTOGRAD_HAS_MPI
  std::string mpirun(int np) const {
    return std::string(kMpiexec) + " --quiet -np " + std::to_string(np) + " --bind-to none ";
  }

  // Runs dist_worker on np processes (np 0: alone, without mpirun) and returns the parameters after every step.
  std::vector<std::vector<float>> worker(int np, const std::string& args, const std::string& name) {
    const fs::path params = dir_ / (name + ".bin");
    const Proc r = shell((np > 0 ? mpirun(np) : std::string()) + kWorker + " params=" + params.string() + " " + args);
    EXPECT_EQ(r.status, 0) << name << "\nstdout: " << r.out << "\nstderr: " << r.err;
    const std::string bytes = slurp(params);
    std::vector<float> all(bytes.size() / 4);
    std::memcpy(all.data(), bytes.data(), all.size() * 4);
    const size_t steps = 5, per_step = all.size() / steps;
    std::vector<std::vector<float>> out;
    for (size_t s = 0; s < steps && per_step > 0; ++s)
      out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(s * per_step),
                       all.begin() + static_cast<std::ptrdiff_t>((s + 1) * per_step));
    return out;
  }
#endif

  fs::path dir_;
};

#if ATTOGRAD_HAS_MPI

// Bitwise: the same floats, bit for bit (-0.0 and +0.0 differ).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// PyTorch's DDP test (_test_DDP_niter): the same global batch on 1, 2 and 4 processes, the parameters after each of
// the first 5 steps equal to within float tolerance. SGD, so that an update is proportional to the gradient.
TEST_F(Mpi, OneTwoAndFourProcessesAgreeAfterEachStep) {
  const std::string args = "steps=5 batch=8 optimizer=sgd";
  const auto one = worker(0, args, "one");
  ASSERT_EQ(one.size(), 5u);
  for (int np : {2, 4}) {
    const auto many = worker(np, args, "np" + std::to_string(np));
    ASSERT_EQ(many.size(), 5u) << np;
    for (size_t s = 0; s < 5; ++s) {
      ASSERT_EQ(many[s].size(), one[s].size());
      double worst = 0;
      for (size_t i = 0; i < one[s].size(); ++i) worst = std::max(worst, std::fabs(double(many[s][i]) - one[s][i]));
      EXPECT_LE(worst, 2e-6) << np << " processes, step " << s + 1;
      EXPECT_FALSE(s > 0 && same_bits(one[s], one[s - 1])) << "the parameters did not move at step " << s + 1;
    }
  }
}

// N processes give bit for bit the weights of one process with grad_accum N (dropout on, AdamW), and two runs on N
// processes are bitwise identical.
TEST_F(Mpi, NProcessesEqualGradAccumNBitwise) {
  const std::string args = "steps=5 batch=8 optimizer=adamw dropout=0.1";
  for (int np : {2, 4}) {
    const auto accum = worker(0, args + " grad_accum=" + std::to_string(np), "accum" + std::to_string(np));
    const auto many = worker(np, args, "np" + std::to_string(np));
    ASSERT_EQ(accum.size(), 5u);
    ASSERT_EQ(many.size(), 5u);
    for (size_t s = 0; s < 5; ++s) EXPECT_TRUE(same_bits(many[s], accum[s])) << np << " processes, step " << s + 1;
  }
  const auto again = worker(2, args, "np2_again");
  const auto first = worker(2, args, "np2_first");
  for (size_t s = 0; s < 5; ++s) EXPECT_TRUE(same_bits(again[s], first[s])) << "step " << s + 1;
}

// With the attention-entropy regulariser too: each micro-batch's term is weighted alike on N ranks and with
// grad_accum N.
TEST_F(Mpi, EntropyRegulariserKeepsNProcessesEqualToGradAccumN) {
  const std::string args = "steps=5 batch=8 optimizer=adamw dropout=0.1 entropy_reg=0.5";
  const auto accum = worker(0, args + " grad_accum=2", "ent_accum2");
  const auto many = worker(2, args, "ent_np2");
  const auto plain = worker(0, "steps=5 batch=8 optimizer=adamw dropout=0.1 grad_accum=2", "ent_plain");
  ASSERT_EQ(accum.size(), 5u);
  ASSERT_EQ(many.size(), 5u);
  ASSERT_EQ(plain.size(), 5u);
  for (size_t s = 0; s < 5; ++s) EXPECT_TRUE(same_bits(many[s], accum[s])) << "step " << s + 1;
  EXPECT_FALSE(same_bits(accum[4], plain[4]));  // the regulariser changed the training
}

// Reducing in buckets while the backward runs (any bucket size) gives the same bits as reducing after it.
TEST_F(Mpi, OverlapAndBucketsChangeNoBit) {
  const std::string args = "steps=5 batch=8 optimizer=adamw dropout=0.1";
  const auto after = worker(2, args + " overlap=0", "after");
  ASSERT_EQ(after.size(), 5u);
  for (const char* buckets : {"100", "1000", "100000000"}) {
    const auto during = worker(2, args + " overlap=1 bucket_floats=" + buckets, std::string("during") + buckets);
    ASSERT_EQ(during.size(), 5u);
    for (size_t s = 0; s < 5; ++s) EXPECT_TRUE(same_bits(during[s], after[s])) << buckets << ", step " << s + 1;
  }
}

// The fixed order is the point: with the transport's own order the result is still within rounding.
TEST_F(Mpi, AnyOrderIsWithinRounding) {
  const auto fixed = worker(2, "steps=5 batch=8 optimizer=sgd", "fixed");
  const auto any = worker(2, "steps=5 batch=8 optimizer=sgd order=any", "any");
  ASSERT_EQ(any.size(), 5u);
  for (size_t s = 0; s < 5; ++s)
    for (size_t i = 0; i < fixed[s].size(); ++i) ASSERT_NEAR(any[s][i], fixed[s][i], 2e-6) << "step " << s + 1;
}

// A checkpoint saved by 2 processes resumes bit-exactly on 2 processes, and on 4 exactly as one process with
// grad_accum 4 resumes it.
TEST_F(Mpi, ResumeIsBitExactOnAnyProcessCount) {
  const std::string args = "batch=8 optimizer=adamw dropout=0.1";
  const std::string ckpt = (dir_ / "ck.attograd").string();
  const auto full = worker(2, args + " steps=5", "full");
  ASSERT_EQ(shell(mpirun(2) + kWorker + " " + args + " steps=2 save_at=2 ckpt=" + ckpt).status, 0);
  ASSERT_TRUE(fs::exists(ckpt));
  // Steps 3..5 after the resume land in the first three slots.
  const fs::path resumed = dir_ / "resumed.bin";
  const Proc r = shell(mpirun(2) + kWorker + " " + args + " steps=5 resume=" + ckpt + " params=" + resumed.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string bytes = slurp(resumed);
  const size_t n = full[0].size();
  ASSERT_EQ(bytes.size(), 3 * n * 4);
  for (size_t s = 0; s < 3; ++s)
    EXPECT_EQ(std::memcmp(bytes.data() + s * n * 4, full[s + 2].data(), n * 4), 0) << "step " << s + 3;

  const fs::path on4 = dir_ / "on4.bin", accum4 = dir_ / "accum4.bin";
  ASSERT_EQ(shell(mpirun(4) + kWorker + " " + args + " steps=5 resume=" + ckpt + " params=" + on4.string()).status, 0);
  ASSERT_EQ(
      shell(std::string(kWorker) + " " + args + " steps=5 grad_accum=4 resume=" + ckpt + " params=" + accum4.string())
          .status,
      0);
  EXPECT_EQ(slurp(on4).size(), 3 * n * 4);
  EXPECT_EQ(slurp(on4), slurp(accum4));
}

// A rank whose parameters changed behind the Trainer's back: every rank stops at the next check, and rank 0 names
// the rank.
TEST_F(Mpi, DivergedReplicaIsNamed) {
  const Proc r = shell(mpirun(3) + kWorker + " steps=5 batch=6 corrupt_rank=2 corrupt_step=2 hash_every=1");
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("dist_worker: check_replicas: the ranks' parameters diverged after step 3: rank 2 differs "
                       "from rank 0"),
            std::string::npos)
      << r.err;
}

// A rank killed mid-run: the others stop within a bounded time, and the last checkpoint is intact and resumes.
TEST_F(Mpi, KilledRankStopsTheRunAndTheCheckpointResumes) {
  const std::string args = "batch=8 optimizer=adamw";
  const std::string ckpt = (dir_ / "ck.attograd").string();
  const Proc r = shell(
      mpirun(2) + kWorker + " " + args + " steps=1000000 save_at=2 ckpt=" + ckpt + " kill_rank=1 kill_step=4", 60);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.status, 124) << "timeout: the surviving rank hung";  // timeout's status
  EXPECT_LT(r.seconds, 60);
  ASSERT_TRUE(fs::exists(ckpt));
  for (const auto& e : fs::directory_iterator(dir_))  // no temporary file left beside it
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  const auto full = worker(2, args + " steps=5", "full");
  const fs::path resumed = dir_ / "resumed.bin";
  ASSERT_EQ(shell(mpirun(2) + kWorker + " " + args + " steps=5 resume=" + ckpt + " params=" + resumed.string()).status,
            0);
  const std::string bytes = slurp(resumed);
  const size_t n = full[0].size();
  ASSERT_EQ(bytes.size(), 3 * n * 4);
  EXPECT_EQ(std::memcmp(bytes.data() + 2 * n * 4, full[4].data(), n * 4), 0);
}

#ifdef ATTOGRAD_CLI
constexpr const char* kCli = ATTOGRAD_CLI;

// `mpirun -np N attograd train`: rank 0 writes the usual outputs, equal to one process with --grad-accum N.
TEST_F(Mpi, CliTrainsOnTwoProcesses) {
  const std::string args =
      " train --layers 1 --d-model 16 --heads 2 --d-ff 32 --max-len 6 --batch 8 --steps 4 "
      "--eval-size 20 --samples 2 --dropout 0.1 -q --json";
  const Proc two = shell(mpirun(2) + kCli + args + " --out np2");
  ASSERT_EQ(two.status, 0) << two.err;
  EXPECT_NE(two.out.find("\"ranks\":2"), std::string::npos) << two.out;
  const Proc one = shell(std::string(kCli) + args + " --grad-accum 2 --out ga2");
  ASSERT_EQ(one.status, 0) << one.err;
  for (const char* f : {"model.attograd", "checkpoint.attograd", "metrics.csv", "config.json", "samples.txt"})
    EXPECT_TRUE(fs::exists(dir_ / "np2" / f)) << f;
  // Same losses, step by step (the seconds column aside).
  auto losses = [&](const fs::path& p) {
    std::stringstream in(slurp(p));
    std::string line, out;
    while (std::getline(in, line)) out += line.substr(0, line.find(',', line.find(',') + 1)) + "\n";
    return out;
  };
  EXPECT_EQ(losses(dir_ / "np2/metrics.csv"), losses(dir_ / "ga2/metrics.csv"));
  // The resume on 4 processes continues.
  const Proc more = shell(mpirun(4) + kCli + " train --resume np2/checkpoint.attograd --steps 6 -q --json");
  EXPECT_EQ(more.status, 0) << more.err;
  EXPECT_NE(more.out.find("\"steps\":6"), std::string::npos) << more.out;
}

// One line on stderr, from rank 0.
void expect_error_line(const Proc& r, const std::string& substring) {
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;  // mpirun --quiet adds nothing
  EXPECT_EQ(r.err.rfind("attograd train: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(substring), std::string::npos) << "expected '" << substring << "' in " << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

// Bad input: one line from rank 0, exit status 2, nothing written.
void expect_error(const Proc& r, const std::string& substring) {
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  expect_error_line(r, substring);
}

TEST_F(Mpi, CliRefusesABatchTheRanksDoNotDivide) {
  const Proc r = shell(mpirun(4) + kCli + " train --batch 6 --steps 2 --out bad");
  expect_error(r, "the global batch (6) must be divisible by ranks x grad_accum (4 x 1 = 4)");
  EXPECT_FALSE(fs::exists(dir_ / "bad"));
}

// Ranks that disagree on anything that changes the run or how they communicate: before the first collective that
// depends on an option, one line from rank 0 names the option and the ranks, every rank exits (status 2, in
// bounded time: no deadlock, no heap corruption), and nothing is written.
const std::string kTiny = " train --layers 1 --d-model 16 --heads 2 --d-ff 32 --batch 4 --steps 2 -q";
const std::string kSmall = kTiny + " --out bad";

class MpiAgreement : public Mpi {
 protected:
  // `attograd <args>` as one rank's program, writing its exit status to status.<rank>.
  static std::string tool(const std::string& args) {
    return std::string(" sh -c '") + kCli + args + "; s=$?; echo $s >status.$OMPI_COMM_WORLD_RANK; exit $s' ";
  }
  // Runs an mpirun command line (fresh status files). mpirun ends the whole job when the first process exits with an
  // error, possibly before another rank's wrapper has written its status: so that every rank's status can be seen,
  // these runs ask it not to (then mpirun's own status is 0; MpiAgreement.Build and the Mpi.Cli* tests run with
  // the default: mpirun's status 2, and the same one line).
  Proc run(const std::string& cmd) {
    for (int r = 0; r < 4; ++r) fs::remove(dir_ / ("status." + std::to_string(r)));
    return shell("env OMPI_MCA_orte_abort_on_non_zero_status=0 " + cmd, kBound);
  }
  // Rank 0 runs `attograd <a>`, rank 1 `attograd <b>` (mpirun's multiple-program form).
  Proc two_ranks(const std::string& a, const std::string& b) { return run(mpirun(1) + tool(a) + " : -np 1" + tool(b)); }
  // One line from rank 0, every rank's status 2, in bounded time.
  void expect_one_line_and_every_rank_2(const Proc& r, const std::string& substring, int ranks) {
    expect_error_line(r, substring);
    EXPECT_NE(r.status, 124) << "timeout: the ranks hung";
    EXPECT_LT(r.seconds, kBound);
    EXPECT_EQ(r.err.find("malloc"), std::string::npos) << r.err;
    for (int rank = 0; rank < ranks; ++rank)
      EXPECT_EQ(slurp(dir_ / ("status." + std::to_string(rank))), "2\n") << "the exit status of rank " << rank;
  }
  // The one line naming the option, every rank's status 2, in bounded time, and no output directory.
  void expect_disagreement(const Proc& r, const std::string& line, int ranks = 2) {
    expect_one_line_and_every_rank_2(r, "set_communicator: ranks disagree on " + line, ranks);
    EXPECT_FALSE(fs::exists(dir_ / "bad")) << "an output directory was written";
  }
  static constexpr int kBound = 60;  // seconds; a disagreement takes about as long as starting the processes
};

TEST_F(MpiAgreement, HashEvery) {
  expect_disagreement(two_ranks(kSmall, kSmall + " --hash-every 1"), "--hash-every: rank 0 has 100, rank 1 has 1\n");
}

TEST_F(MpiAgreement, NoOverlap) {
  expect_disagreement(two_ranks(kSmall, kSmall + " --no-overlap"), "--no-overlap: rank 0 has false, rank 1 has true\n");
}

TEST_F(MpiAgreement, Allreduce) {
  expect_disagreement(two_ranks(kSmall + " --allreduce any", kSmall),
                      "--allreduce: rank 0 has any, rank 1 has fixed\n");
}

// Four ranks, rank 2 alone differs.
TEST_F(MpiAgreement, BucketMb) {
  const std::string a = tool(kSmall + " --bucket-mb 25");
  const Proc r = run(mpirun(2) + a + " : -np 1" + tool(kSmall + " --bucket-mb 4") + " : -np 1" + a);
  expect_disagreement(r, "--bucket-mb: rank 0 has 25, rank 2 has 4\n", 4);
}

// A TrainConfig field (and grad accumulation, which changes the micro-batches but not the batch).
TEST_F(MpiAgreement, TrainConfigField) {
  expect_disagreement(two_ranks(kSmall, kSmall + " --lr 0.001"), "--lr: rank 0 has 0.005, rank 1 has 0.001\n");
  expect_disagreement(two_ranks(kSmall + " --grad-accum 2", kSmall), "--grad-accum: rank 0 has 2, rank 1 has 1\n");
}

// The same characters in another order: the file's bytes are compared (XXH64), not its size or vocabulary. A copy
// of the file at another path trains as one.
TEST_F(MpiAgreement, ReorderedTextFile) {
  std::string text;
  for (int i = 0; i < 20; ++i) text += "the quick brown fox jumps over the lazy dog\n";
  std::string reordered(text.rbegin(), text.rend());
  for (const auto& [name, bytes] : {std::pair{"a.txt", text}, {"b.txt", reordered}, {"copy.txt", text}}) {
    std::ofstream f(dir_ / name, std::ios::binary);
    f << bytes;
  }
  const std::string args = kTiny + " --context 8 --text ";
  const Proc r = two_ranks(args + "a.txt --out bad", args + "b.txt --out bad");
  expect_disagreement(r, "--text: rank 0 has '" + (dir_ / "a.txt").string() + "' (XXH64 ");
  EXPECT_NE(r.err.find("rank 1 has '" + (dir_ / "b.txt").string() + "' (XXH64 "), std::string::npos) << r.err;
  const Proc same = two_ranks(args + "a.txt --out good", args + "copy.txt --out good");
  EXPECT_EQ(same.status, 0) << same.err;
  EXPECT_TRUE(fs::exists(dir_ / "good/model.attograd"));
}

// The same lines shuffled.
TEST_F(MpiAgreement, ShuffledPairsFile) {
  const std::vector<std::string> lines{"ab\tba", "abc\tcba", "ba\tab", "cab\tbac", "bca\tacb", "cc\tcc"};
  for (const auto& [name, order] : {std::pair{"a.tsv", std::vector<int>{0, 1, 2, 3, 4, 5}},
                                    std::pair{"b.tsv", std::vector<int>{3, 0, 5, 1, 4, 2}}}) {
    std::ofstream f(dir_ / name, std::ios::binary);
    for (int i : order) f << lines[static_cast<size_t>(i)] << "\n";
  }
  const Proc r = two_ranks(kSmall + " --pairs a.tsv", kSmall + " --pairs b.tsv");
  expect_disagreement(r, "--pairs: rank 0 has '" + (dir_ / "a.tsv").string() + "' (XXH64 ");
  EXPECT_NE(r.err.find(", rank 1 has '" + (dir_ / "b.tsv").string()), std::string::npos) << r.err;
}

// Checkpoints of another step, or of the same step of another run; a copy of the same checkpoint resumes.
TEST_F(MpiAgreement, DifferentResumedCheckpoints) {
  const std::string small = " train --layers 1 --d-model 16 --heads 2 --d-ff 32 --batch 4 -q";
  ASSERT_EQ(shell(std::string(kCli) + small + " --steps 2 --out a").status, 0);
  ASSERT_EQ(shell(std::string(kCli) + small + " --steps 3 --out b").status, 0);
  ASSERT_EQ(shell(std::string(kCli) + small + " --steps 2 --seed 2 --out c").status, 0);
  const std::string before = slurp(dir_ / "a/checkpoint.attograd");
  const std::string resume = " train --steps 4 -q --out bad --resume ";
  Proc r = two_ranks(resume + "a/checkpoint.attograd", resume + "b/checkpoint.attograd");
  expect_disagreement(r, "--resume: rank 0 has 'a/checkpoint.attograd' (step 2, XXH64 ");
  EXPECT_NE(r.err.find(", rank 1 has 'b/checkpoint.attograd' (step 3, XXH64 "), std::string::npos) << r.err;
  r = two_ranks(resume + "a/checkpoint.attograd", resume + "c/checkpoint.attograd");
  expect_disagreement(r, "--resume: rank 0 has 'a/checkpoint.attograd' (step 2, XXH64 ");
  EXPECT_NE(r.err.find(", rank 1 has 'c/checkpoint.attograd' (step 2, XXH64 "), std::string::npos) << r.err;
  EXPECT_EQ(slurp(dir_ / "a/checkpoint.attograd"), before) << "the checkpoint changed";
  fs::create_directories(dir_ / "copy");
  fs::copy_file(dir_ / "a/checkpoint.attograd", dir_ / "copy/checkpoint.attograd");
  r = two_ranks(" train --steps 3 -q --out good --resume a/checkpoint.attograd",
                " train --steps 3 -q --out good --resume copy/checkpoint.attograd");
  EXPECT_EQ(r.status, 0) << r.err;
}

// A build of its own (ATTOGRAD_BUILD_ID_SALT stands in for another binary).
TEST_F(MpiAgreement, Build) {
  const Proc r = shell(mpirun(1) + kCli + kSmall + " : -np 1 -x ATTOGRAD_BUILD_ID_SALT=other " + kCli + kSmall, kBound);
  expect_error(r, "set_communicator: ranks disagree on the build: rank 0 has attograd built ");  // mpirun's status 2
  EXPECT_LT(r.seconds, kBound);
  EXPECT_FALSE(fs::exists(dir_ / "bad"));
  EXPECT_NE(r.err.find("other\n"), std::string::npos) << r.err;
}

// A loss every rank sees go non-finite (the gathered loss): one line, from rank 0, and every rank's status 2.
TEST_F(MpiAgreement, NonFiniteLossIsOneLine) {
  const Proc r = run(mpirun(2) + tool(" train --layers 1 --d-model 16 --heads 2 --d-ff 32 --batch 4 --steps 5 -q "
                                      "--out nan --optimizer sgd --momentum 0 --schedule constant --clip 0 --lr 1e30"));
  expect_one_line_and_every_rank_2(r, "attograd train: error: Trainer: loss is not finite (", 2);
}

TEST_F(Mpi, CliNamesTheRankThatCannotReadItsCheckpoint) {
  const std::string small = " train --layers 1 --d-model 16 --heads 2 --d-ff 32 --batch 4 --steps 2 -q";
  ASSERT_EQ(shell(std::string(kCli) + small + " --out good").status, 0);
  const std::string good = slurp(dir_ / "good/checkpoint.attograd");
  fs::create_directories(dir_ / "broken");
  {
    std::ofstream f(dir_ / "broken/checkpoint.attograd", std::ios::binary);
    f << good.substr(0, good.size() / 2);
  }
  const Proc r = shell(mpirun(1) + kCli + " train --resume good/checkpoint.attograd --steps 4 : -np 1 " + kCli +
                       " train --resume broken/checkpoint.attograd --steps 4");
  expect_error(r, "train: rank 1: ");
  EXPECT_EQ(slurp(dir_ / "good/checkpoint.attograd"), good) << "the checkpoint changed";
}
#endif  // ATTOGRAD_CLI

#else
TEST_F(Mpi, SkippedWithoutMpi) {}
#endif  // ATTOGRAD_HAS_MPI

}  // namespace
