// A small training run for the data-parallel tests (tests/train/dist/test_mpi.cpp), started alone or under mpirun:
// trains a tiny model with the Trainer on every rank and lets the tests observe and disturb it.
//   dist_worker key=value ...
//     steps=5 batch=8 grad_accum=1 dropout=0 optimizer=sgd order=fixed hash_every=1   the run
//     entropy_reg=0        the attention-entropy regulariser's lambda
//     overlap=1 bucket_floats=1000    reduce in buckets of about 1000 floats during the backward (0: after it)
//     params=FILE          rank 0 appends every parameter (float32, named_parameters() order) after every step
//     resume=FILE          loads a checkpoint first
//     save_at=S ckpt=FILE  saves a checkpoint after step S (collective; rank 0 writes)
//     corrupt_rank=R corrupt_step=S   after step S, rank R changes one weight (the replica check must notice)
//     kill_rank=R kill_step=S         after step S, rank R kills itself with SIGKILL
//     reduce_bench=FLOATS             times allreduce_sum alone (median of 7, each order) and exits
// Exit status 0, or 2 with one line on stderr from rank 0 ("dist_worker: ...").

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "autograd/autograd.h"
#include "train/dist/mpi.h"
#include "train/trainer.h"

using namespace attograd;

namespace {

int run(const std::map<std::string, std::string>& args, const std::shared_ptr<dist::Communicator>& comm) {
  auto get = [&](const std::string& k, const std::string& fallback) {
    const auto it = args.find(k);
    return it == args.end() ? fallback : it->second;
  };
  auto num = [&](const std::string& k, int64_t fallback) { return std::stoll(get(k, std::to_string(fallback))); };
  train::TrainConfig c;
  c.layers = 1;
  c.d_model = 16;
  c.heads = 2;
  c.d_ff = 32;
  c.max_len = 6;
  c.model = get("model", "lm");
  c.batch = num("batch", 8);
  c.steps = num("steps", 5);
  c.grad_accum = num("grad_accum", 1);
  c.dropout = std::stod(get("dropout", "0"));
  c.entropy_reg = std::stod(get("entropy_reg", "0"));
  c.optimizer = get("optimizer", "sgd");
  c.lr = c.optimizer == "sgd" ? 0.1 : 5e-3;
  c.schedule = "constant";
  c.eval_every = 0;
  c.eval_size = 10;
  const int64_t corrupt_rank = num("corrupt_rank", -1), corrupt_step = num("corrupt_step", -1);
  const int64_t kill_rank = num("kill_rank", -1), kill_step = num("kill_step", -1);
  const int64_t save_at = num("save_at", -1);
  const std::string params = get("params", ""), resume = get("resume", ""), ckpt = get("ckpt", "");

  if (const int64_t floats = num("reduce_bench", 0); floats > 0) {  // the all-reduce alone, for docs/DISTRIBUTED.md
    std::vector<float> buf(static_cast<size_t>(floats), 1.0f);
    for (const char* order : {"fixed", "any"}) {
      std::vector<double> times;
      for (int rep = 0; rep < 7; ++rep) {
        comm->allgather("");  // start together
        const double before = comm->reduce_seconds();
        comm->allreduce_sum(buf.data(), floats, dist::parse_reduce_order(order));
        times.push_back(comm->reduce_seconds() - before);
      }
      std::sort(times.begin(), times.end());
      if (comm->rank() == 0)
        std::printf("all-reduce of %lld floats on %d processes, %s order: median %.2f ms\n",
                    static_cast<long long>(floats), comm->size(), order, times[3] * 1e3);
    }
    return 0;
  }
  std::string error;
  std::unique_ptr<train::Trainer> t;
  try {
    t = std::make_unique<train::Trainer>(c);
    if (!resume.empty()) t->load_checkpoint(resume);
  } catch (const Error& e) {
    error = e.what();
  }
  comm->agree("dist_worker", error);
  t->set_communicator(comm, {.order = dist::parse_reduce_order(get("order", "fixed")),
                             .hash_every = num("hash_every", 1),
                             .overlap = num("overlap", 1) != 0,
                             .bucket_floats = num("bucket_floats", 1000)});
  std::ofstream out;
  if (!params.empty() && comm->rank() == 0) out.open(params, std::ios::binary | std::ios::app);
  while (t->step_count() < c.steps) {
    t->step();
    const int64_t s = t->step_count();
    if (s == corrupt_step && comm->rank() == corrupt_rank) {
      NoGradGuard g;
      Tensor w = t->model().parameters().front();
      w.data<float>()[0] += 1e-3f;
    }
    if (s == kill_step && comm->rank() == kill_rank) std::raise(SIGKILL);
    if (s == save_at) t->save_checkpoint(ckpt);
    if (out.is_open())
      for (const Tensor& p : t->model().parameters())
        out.write(reinterpret_cast<const char*>(p.data<float>()), static_cast<std::streamsize>(p.numel() * 4));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "dist_worker: expected key=value, got '%s'\n", argv[i]);
      return 2;
    }
    args[a.substr(0, eq)] = a.substr(eq + 1);
  }
  std::shared_ptr<dist::Communicator> comm;
  if (dist::launcher_world_size() > 0)
    comm = dist::mpi_world();
  else
    comm = std::make_shared<dist::SingleProcess>();
  try {
    return run(args, comm);
  } catch (const std::exception& e) {
    if (!comm->failed_together()) {
      std::fprintf(stderr, "dist_worker: rank %d: %s\n", comm->rank(), e.what());
      comm->abort(2);
    }
    if (comm->rank() == 0) {  // rank 0 reports; the others wait until it has (then every rank exits 2)
      std::fprintf(stderr, "dist_worker: %s\n", e.what());
      std::fflush(stderr);
    }
    try {
      comm->allgather("");
    } catch (const std::exception&) {
    }
    return 2;
  }
}
