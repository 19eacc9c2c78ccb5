// The install test's consumer: one include, then a tiny model trained a few steps, saved and reloaded.

#include <attograd/attograd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

using namespace attograd;

int main() {
  Generator gen(0);
  // y = x A^T + b for a fixed A, b: a Linear learns it with Adam.
  Tensor x = randn({16, 4}, gen);
  Tensor a = randn({3, 4}, gen);
  Tensor y = add(matmul(x, transpose(a, 0, 1)), full({3}, 0.5));

  nn::Linear model(4, 3, true, gen);
  optim::Adam opt(model.named_parameters(), {.lr = 0.05});
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    Tensor loss = mse_loss(model.forward(x), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  if (!(last < 0.5 * first)) {
    std::fprintf(stderr, "consumer: the loss did not fall: %g -> %g\n", first, last);
    return 1;
  }

  // The weights file (its XXH64 checksum links libxxhash) round-trips.
  const std::string path =
      std::string(std::getenv("CONSUMER_TMP") ? std::getenv("CONSUMER_TMP") : ".") + "/consumer.attograd";
  io::save(model, path);
  nn::Linear reloaded(4, 3, true, gen);
  io::load(reloaded, path);
  Tensor diff = sum(abs(sub(reloaded.forward(x), model.forward(x))));
  if (diff.item() != 0) {
    std::fprintf(stderr, "consumer: the reloaded model differs by %g\n", diff.item());
    return 1;
  }
  std::printf("consumer: trained, loss %g -> %g, weights reloaded\n", first, last);
  return 0;
}
