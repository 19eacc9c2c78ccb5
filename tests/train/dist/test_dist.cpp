// Data-parallel training in one process (no MPI needed): the fixed-order sum, the single-process communicator,
// agreeing on errors, grad_accum in TrainConfig and the Trainer (micro-batches equal the whole batch within
// rounding, bit-identical runs and resume), and the Trainer's checks of the ranks through a fake communicator.
// The multi-process proofs are in test_mpi.cpp.

#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "testing.h"
#include "train/dist/communicator.h"
#include "train/trainer.h"

namespace attograd::dist {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(OrderedSum, AddsInRankOrderStartingFromACopy) {
  // Rounding makes the order visible: (1e8 + 1) + -1e8 = 0 in float, 1e8 + (1 + -1e8) = 0 too, but
  // (1e8 + -1e8) + 1 = 1.
  const std::vector<float> a{1e8f, 1e8f, -0.0f}, b{1.0f, -1e8f, -0.0f}, c{-1e8f, 1.0f, -0.0f};
  std::vector<float> out(3, 42.0f);
  ordered_sum({a.data(), b.data(), c.data()}, 3, out.data());
  volatile float x0 = 1e8f, x1 = 1.0f, x2 = -1e8f;  // the left fold, written out
  EXPECT_EQ(out[0], (x0 + x1) + x2);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 1.0f);  // (1e8 + -1e8) + 1
  EXPECT_EQ(bits(out[2]), bits(-0.0f)) << "-0.0 + -0.0 + -0.0 keeps its sign (no 0.0 + x start)";
  // One part: a copy, -0.0 included; out may alias the first part.
  std::vector<float> one{-0.0f, 3.5f};
  ordered_sum({one.data()}, 2, one.data());
  EXPECT_EQ(bits(one[0]), bits(-0.0f));
  EXPECT_EQ(one[1], 3.5f);
  EXPECT_THROW(ordered_sum({}, 2, one.data()), Error);
}

TEST(SingleProcess, IsAGroupOfOne) {
  SingleProcess comm;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  std::vector<float> v{1.5f, -0.0f};
  comm.allreduce_sum(v.data(), 2, ReduceOrder::Fixed);
  EXPECT_EQ(v[0], 1.5f);
  EXPECT_EQ(bits(v[1]), bits(-0.0f));
  EXPECT_EQ(comm.reduced_floats(), 2);
  EXPECT_EQ(comm.allgather("abc"), std::vector<std::string>{"abc"});
  EXPECT_EQ(comm.allgather_u64(0xfeedfacecafebeefull), std::vector<uint64_t>{0xfeedfacecafebeefull});
  EXPECT_EQ(comm.allgather_f64({0.1, -2.5}), (std::vector<double>{0.1, -2.5}));
  EXPECT_NO_THROW(comm.agree("op", ""));
  EXPECT_FALSE(comm.failed_together());
  try {
    comm.agree("op", "it broke");
    FAIL() << "agree did not throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "op: it broke");
  }
  EXPECT_TRUE(comm.failed_together());
}

TEST(Dist, ParsesTheReduceOrder) {
  EXPECT_EQ(parse_reduce_order("fixed"), ReduceOrder::Fixed);
  EXPECT_EQ(parse_reduce_order("any"), ReduceOrder::Any);
  EXPECT_EQ(to_string(ReduceOrder::Any), "any");
  try {
    parse_reduce_order("ring");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"ring\""), std::string::npos) << e.what();
  }
}

TEST(Dist, ReadsTheLaunchersWorldSize) {
  const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "PMIX_RANK"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* v : vars)
    if (const char* s = std::getenv(v)) saved.emplace_back(v, s);
  for (const char* v : vars) ::unsetenv(v);
  EXPECT_EQ(launcher_world_size(), 0);
  ::setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  EXPECT_EQ(launcher_world_size(), 3);
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::setenv("PMIX_RANK", "0", 1);
  EXPECT_EQ(launcher_world_size(), 1);
  ::unsetenv("PMIX_RANK");
  for (const auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
  EXPECT_NE(build_id().find("attograd built"), std::string::npos);
}

// Ranks as threads of this process, meeting in allgather: agree_on_settings runs on every "rank" at once.
class ThreadRanks {
 public:
  explicit ThreadRanks(int n) : n_(n), slots_(static_cast<size_t>(n)) {}

  class Rank final : public Communicator {
   public:
    Rank(ThreadRanks* group, int rank) : group_(group), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return group_->n_; }
    std::string name() const override { return "threads"; }
    void allreduce_sum(float*, int64_t, ReduceOrder) override { ADD_FAILURE() << "no reduction expected"; }
    std::vector<std::string> allgather(const std::string& bytes) override {
      ++gathers_;
      std::unique_lock<std::mutex> lock(group_->mutex_);
      group_->slots_[static_cast<size_t>(rank_)] = bytes;
      const int64_t round = group_->round_;
      if (++group_->arrived_ == group_->n_) {
        group_->result_ = group_->slots_;
        group_->arrived_ = 0;
        ++group_->round_;
        group_->cv_.notify_all();
      } else {
        group_->cv_.wait(lock, [&] { return group_->round_ != round; });
      }
      return group_->result_;
    }
    [[noreturn]] void abort(int) override { std::abort(); }
    int gathers_ = 0;  // collectives this rank took part in

   private:
    ThreadRanks* group_;
    int rank_;
  };

  // Runs agree_on_settings on every rank with its own settings; returns each rank's error ("" when none).
  std::vector<std::string> agree(const std::vector<std::vector<Setting>>& settings) {
    std::vector<std::string> errors(static_cast<size_t>(n_));
    ranks_.clear();
    for (int r = 0; r < n_; ++r) ranks_.push_back(std::make_unique<Rank>(this, r));
    std::vector<std::thread> threads;
    for (int r = 0; r < n_; ++r)
      threads.emplace_back([&, r] {
        try {
          agree_on_settings(*ranks_[static_cast<size_t>(r)], "agree", settings[static_cast<size_t>(r)]);
        } catch (const Error& e) {
          errors[static_cast<size_t>(r)] = e.what();
          EXPECT_TRUE(ranks_[static_cast<size_t>(r)]->failed_together()) << r;
        }
      });
    for (std::thread& t : threads) t.join();
    return errors;
  }
  std::vector<std::unique_ptr<Rank>> ranks_;

 private:
  int n_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::string> slots_, result_;
  int arrived_ = 0;
  int64_t round_ = 0;
};

std::vector<Setting> some_settings(int count) {
  std::vector<Setting> s;
  for (int i = 0; i < count; ++i) s.push_back({.name = "--opt" + std::to_string(i), .value = std::to_string(i * 7)});
  return s;
}

TEST(AgreeOnSettings, EqualSettingsPassInOneExchange) {
  ThreadRanks group(3);
  const std::vector<Setting> s = some_settings(100);
  EXPECT_EQ(group.agree({s, s, s}), std::vector<std::string>(3, ""));
  for (const auto& rank : group.ranks_) EXPECT_EQ(rank->gathers_, 1);
}

TEST(AgreeOnSettings, NamesTheFirstSettingAndEveryRankThatDiffers) {
  ThreadRanks group(4);
  std::vector<std::vector<Setting>> s(4, some_settings(150));
  // Setting 130 (in the third round of digests) differs on ranks 1 and 3 alike, on rank 2 otherwise; a later one
  // differs too, but only the first is named.
  s[1][130].value = s[3][130].value = "4";
  s[2][130].value = "8";
  s[2][130].shown = "8 MB";
  s[3][140].value = "x";
  const std::vector<std::string> errors = group.agree(s);
  for (const std::string& e : errors)
    EXPECT_EQ(e, "agree: ranks disagree on --opt130: rank 0 has 910, ranks 1 and 3 have 4, rank 2 has 8 MB");
  // One digest, three rounds of per-setting digests (64 each), the names: 5 fixed-size exchanges.
  for (const auto& rank : group.ranks_) EXPECT_EQ(rank->gathers_, 5);
}

TEST(AgreeOnSettings, ACountThatDiffersOrAGarbledValueEndsInBoundedExchanges) {
  ThreadRanks group(2);
  // Rank 1 has one setting more: the first it has alone is named, rank 0 has nothing there.
  std::vector<std::vector<Setting>> s{some_settings(64), some_settings(65)};
  std::vector<std::string> errors = group.agree(s);
  EXPECT_EQ(errors[0], "agree: ranks disagree on --opt64: rank 0 has nothing, rank 1 has 448");
  EXPECT_EQ(errors[1], errors[0]);
  // A long value with a line break is cut and kept on one line.
  s = {some_settings(3), some_settings(3)};
  s[1][0].value = "line\n" + std::string(1000, 'v');
  errors = group.agree(s);
  EXPECT_EQ(errors[0].find('\n'), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank 1 has line?vvv"), std::string::npos) << errors[0];
  EXPECT_LT(errors[0].size(), 300u) << errors[0];
  EXPECT_EQ(errors[1], errors[0]);
  // The lengths are part of what is compared: ("ab", "c") is not ("a", "bc").
  s = {{{.name = "ab", .value = "c"}}, {{.name = "a", .value = "bc"}}};
  errors = group.agree(s);
  EXPECT_EQ(errors[0], "agree: ranks disagree on ab: rank 0 has c, rank 1 has bc");
}

}  // namespace
}  // namespace attograd::dist

namespace attograd::train {
namespace {

TrainConfig tiny(int64_t grad_accum, double dropout = 0.0, const std::string& optimizer = "sgd") {
  TrainConfig c;
  c.task = "copy";
  c.layers = 1;
  c.d_model = 16;
  c.heads = 2;
  c.d_ff = 32;
  c.max_len = 5;
  c.batch = 12;
  c.steps = 6;
  c.optimizer = optimizer;
  c.lr = optimizer == "sgd" ? 0.1 : 3e-3;
  c.schedule = "constant";
  c.dropout = dropout;
  c.eval_every = 0;
  c.eval_size = 10;
  c.grad_accum = grad_accum;
  return c;
}

std::vector<Tensor> snapshot(Trainer& t) {
  std::vector<Tensor> out;
  for (const Tensor& p : t.model().parameters()) out.push_back(p.clone());
  return out;
}

TEST(GradAccum, InTheConfigOnlyWhenNotOne) {
  TrainConfig c;
  EXPECT_EQ(c.grad_accum, 1);
  EXPECT_EQ(c.to_json().find("grad_accum"), std::string::npos) << "a single-process config reads as before";
  c.batch = 12;
  c.grad_accum = 3;
  EXPECT_NE(c.to_json(-1).find("\"grad_accum\":3"), std::string::npos);
  EXPECT_EQ(TrainConfig::from_json(c.to_json()), c);
  EXPECT_NO_THROW(c.validate());
  c.grad_accum = 5;
  try {
    c.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch (12) must be divisible by grad_accum (5)"), std::string::npos)
        << e.what();
  }
  c.grad_accum = 0;
  EXPECT_THROW(c.validate(), Error);
}

// K micro-batches give the whole batch's step within rounding: the same loss, tokens and parameters.
TEST(GradAccum, MicroBatchesMatchTheWholeBatch) {
  Trainer whole(tiny(1)), micro(tiny(4));
  for (int s = 0; s < 3; ++s) {
    const StepMetrics a = whole.step(), b = micro.step();
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * a.loss);
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-4 * a.grad_norm);
  }
  const std::vector<Tensor> pa = snapshot(whole), pb = snapshot(micro);
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(testing::all_close(pb[i], pa[i], 2e-6)) << i;
  EXPECT_EQ(micro.communicator().reduced_floats(), 3 * micro.model().num_parameters());
}

// With dropout and AdamW: two runs bitwise equal, and a resumed run continues bit-identically.
TEST(GradAccum, RunsAndResumeAreBitIdentical) {
  const std::string path = ::testing::TempDir() + "attograd_dist_" + std::to_string(::getpid()) + ".ckpt";
  Trainer a(tiny(3, 0.1, "adamw")), b(tiny(3, 0.1, "adamw"));
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(a.step().loss, b.step().loss);
  }
  a.save_checkpoint(path);
  Trainer c(tiny(3, 0.1, "adamw"));
  c.load_checkpoint(path);
  std::remove(path.c_str());
  for (int s = 0; s < 3; ++s) {
    const double la = a.step().loss, lc = c.step().loss;
    EXPECT_EQ(la, lc) << "step " << s + 4;
  }
  const std::vector<Tensor> pa = snapshot(a), pc = snapshot(c);
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(testing::bitwise_equal(pc[i], pa[i])) << i;
}

// A stand-in for rank 0 of `n` ranks whose peers all answer like it, except that rank `odd` answers `odd_value`.
class FakeRanks final : public dist::Communicator {
 public:
  FakeRanks(int n, int odd = -1) : n_(n), odd_(odd) {}
  int rank() const override { return 0; }
  int size() const override { return n_; }
  std::string name() const override { return "fake"; }
  void allreduce_sum(float* data, int64_t n, dist::ReduceOrder) override {
    for (int64_t i = 0; i < n; ++i) data[i] *= static_cast<float>(n_);  // n identical ranks
  }
  std::vector<std::string> allgather(const std::string& bytes) override {
    std::vector<std::string> all(static_cast<size_t>(n_), bytes);
    if (odd_ >= 0 && armed_) all[static_cast<size_t>(odd_)] = std::string(bytes.size(), '\x5a');
    return all;
  }
  [[noreturn]] void abort(int) override { std::abort(); }
  bool armed_ = false;  // whether rank `odd` answers differently

 private:
  int n_, odd_;
};

TEST(SetCommunicator, RefusesABatchTheRanksDoNotDivide) {
  Trainer t(tiny(2));  // batch 12
  auto comm = std::make_shared<FakeRanks>(4);
  try {
    t.set_communicator(comm);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the global batch (12) must be divisible by ranks x grad_accum (4 x 2 = 8)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(comm->failed_together());
  EXPECT_EQ(t.communicator().size(), 1) << "kept its single process";
}

TEST(SetCommunicator, NamesTheRankWithAnotherConfigurationOrDivergedParameters) {
  Trainer t(tiny(1));
  auto comm = std::make_shared<FakeRanks>(3, 2);
  comm->armed_ = true;  // rank 2 answers garbage: the first setting (the build) differs
  try {
    t.set_communicator(comm);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(
        std::string(e.what()).rfind("set_communicator: ranks disagree on the build: rank 0 has attograd built ", 0), 0u)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(", rank 2 has "), std::string::npos) << e.what();
  }
  EXPECT_TRUE(comm->failed_together());
  comm->armed_ = false;
  t.set_communicator(comm, {.hash_every = 2});
  EXPECT_EQ(t.communicator().size(), 3);
  t.step();
  EXPECT_NO_THROW(t.check_replicas());
  comm->armed_ = true;
  try {
    t.step();  // step 2: the hash check
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the ranks' parameters diverged after step 2: rank 2 differs from rank 0"),
              std::string::npos)
        << e.what();
  }
}

// What the ranks compare: every option that changes the run, named by its flag.
TEST(SetCommunicator, ComparesEveryOptionNamedByItsFlag) {
  Trainer t(tiny(2));
  dist::SingleProcess comm;
  auto value = [](const std::vector<dist::Setting>& s, const std::string& name) {
    for (const dist::Setting& x : s)
      if (x.name == name) return x.shown.empty() ? x.value : x.shown;
    return std::string("(absent)");
  };
  const std::vector<dist::Setting> s = t.agreement_settings(comm, {.hash_every = 7, .bucket_floats = 25 << 18});
  EXPECT_EQ(s.front().name, "the build");
  EXPECT_EQ(value(s, "--resume"), "none");
  EXPECT_EQ(value(s, "--grad-accum"), "2");
  EXPECT_EQ(value(s, "--symbols"), "10");
  EXPECT_EQ(value(s, "--d-model"), "16");
  EXPECT_EQ(value(s, "--lr"), "0.1");
  EXPECT_EQ(value(s, "--task"), "copy");
  EXPECT_EQ(value(s, "--rope"), "false");  // a field to_json() leaves out at its default is compared too
  EXPECT_EQ(value(s, "--allreduce"), "fixed");
  EXPECT_EQ(value(s, "--hash-every"), "7");
  EXPECT_EQ(value(s, "--no-overlap"), "false");
  EXPECT_EQ(value(s, "--bucket-mb"), "25");
  EXPECT_NE(value(s, "--no-bias"), "(absent)");  // the recipe's fields (issue 22) too
  EXPECT_EQ(value(s, "--precision"), "fp32");    // mixed precision (issue 26): ranks must agree on it
  EXPECT_EQ(s.size(), 61u) << "the build, --resume, 53 config fields, the model, 4 options, the state";
  // Any field changes what is compared; the starting state too.
  TrainConfig c = tiny(2);
  c.label_smoothing = 0.25;
  Trainer other(c);
  EXPECT_EQ(value(other.agreement_settings(comm, {}), "--label-smoothing"), "0.25");
  Trainer same(tiny(2));
  EXPECT_EQ(same.agreement_settings(comm, {}).back().value, t.agreement_settings(comm, {}).back().value);
  same.step();
  EXPECT_NE(same.agreement_settings(comm, {}).back().value, t.agreement_settings(comm, {}).back().value);
}

TEST(ParameterHash, ChangesWithAnyParameter) {
  Trainer t(tiny(1));
  const uint64_t h = t.parameter_hash();
  EXPECT_EQ(t.parameter_hash(), h);
  Tensor w = t.model().parameters().back();
  w.data<float>()[w.numel() - 1] += 1e-6f;
  EXPECT_NE(t.parameter_hash(), h);
}

}  // namespace
}  // namespace attograd::train
