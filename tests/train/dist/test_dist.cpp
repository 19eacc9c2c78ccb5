// Data-parallel training in one process (no MPI needed): the fixed-order sum, the single-process communicator,
// agreeing on errors, grad_accum in TrainConfig and the Trainer (micro-batches equal the whole batch within
// rounding, bit-identical runs and resume), and the Trainer's checks of the ranks through a fake communicator.
// The multi-process proofs are in test_mpi.cpp.

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
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
  comm->armed_ = true;
  try {
    t.set_communicator(comm);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 has a different configuration or build than rank 0"),
              std::string::npos)
        << e.what();
  }
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
