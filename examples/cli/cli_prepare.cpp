// `attograd prepare`: tokenises text files once into a directory of token files (train/data/tokens.h), nanoGPT's
// prepare.py; `attograd train --data DIR` then trains from them without holding the corpus in memory.

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>

#include "cli.h"
#include "train/data/tokens.h"

namespace attograd::cli {

namespace {

struct PrepareArgs {
  data::PrepareOptions opts;
  bool json = false;
  CLI::Option* vocab_size_opt = nullptr;
};

int run_prepare(const PrepareArgs& args) {
  PrepareArgs a = args;
  ATTO_CHECK(a.opts.tokenizer != "char" || a.vocab_size_opt->count() == 0, "prepare",
             "--vocab-size is for --tokenizer bpe or unigram (char has a token per character of the text)");
  if (a.opts.tokenizer != "char" && a.vocab_size_opt->count() == 0) a.opts.vocab_size = data::kDefaultSubwordVocab;
  const auto t0 = std::chrono::steady_clock::now();
  const data::PrepareResult r = data::prepare(a.opts);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.json) {
    nlohmann::ordered_json j;
    j["out"] = r.out;
    j["tokenizer"] = a.opts.tokenizer;
    j["bytes"] = r.bytes;
    j["train_tokens"] = r.train_tokens;
    j["val_tokens"] = r.val_tokens;
    j["vocab_size"] = r.vocab_size;
    j["seconds"] = secs;
    j["peak_rss_mb"] = peak_rss_mb();
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("prepared %s: %s bytes of text from %zu file%s -> %s training and %s held-out tokens (%s tokenizer, "
                "vocabulary %lld) in %.1f s\n",
                r.out.c_str(), thousands(static_cast<int64_t>(r.bytes)).c_str(), a.opts.inputs.size(),
                a.opts.inputs.size() == 1 ? "" : "s", thousands(r.train_tokens).c_str(),
                thousands(r.val_tokens).c_str(), a.opts.tokenizer.c_str(), static_cast<long long>(r.vocab_size),
                secs);
    std::printf("train on it: attograd train --data %s\n", r.out.c_str());
  }
  return kExitOk;
}

}  // namespace

Command add_prepare(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "prepare", "Tokenise text files once into token files that `train --data` reads from disk (any corpus size)");
  auto a = std::make_shared<PrepareArgs>();
  sub->add_option("--text", a->opts.inputs, "UTF-8 text files, concatenated in the order given")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("-o,--out", a->opts.out, "output directory (train.bin, val.bin, meta.json)")->required();
  sub->add_option("--tokenizer", a->opts.tokenizer,
                  "how text becomes tokens: char (a token per character), or a SentencePiece subword tokenizer (bpe, "
                  "unigram) trained on the training part")
      ->capture_default_str()
      ->check(CLI::IsMember({"char", "bpe", "unigram"}));
  a->vocab_size_opt = sub->add_option("--vocab-size", a->opts.vocab_size,
                                      "--tokenizer bpe|unigram: SentencePiece's pieces (the model has 4 more ids; "
                                      "default " + std::to_string(data::kDefaultSubwordVocab) + ")")
                          ->check(integer_in(1, data::kMaxVocabulary - data::Vocabulary::kReserved));
  sub->add_option("--val-fraction", a->opts.val_fraction,
                  "share of the tokens held out for evaluation (the end of the text), in (0, 1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  sub->add_flag("--json", a->json, "print one JSON line instead of the summary");
  sub->footer(
      "Reads each file in blocks (memory does not grow with the corpus), splits off the last --val-fraction of the\n"
      "tokens as held-out data, and writes train.bin and val.bin (a 32-byte header, then uint16 tokens) and meta.json\n"
      "(the tokenizer and its hash) atomically. A subword tokenizer is trained on the training part (its first\n"
      "64 MiB) and stored in meta.json, then in the weights of every model trained on the directory.\n"
      "`attograd train --data DIR` memory-maps the token files and draws random windows, exactly as `train --text`\n"
      "does from a file (docs/DATA.md).\n\n"
      "Examples:\n"
      "  attograd prepare --text book1.txt book2.txt --out data/books\n"
      "  attograd prepare --text corpus/*.txt --tokenizer bpe --vocab-size 2048 --out data/corpus-bpe\n"
      "  attograd train --data data/books --context 256 --steps 2000");
  return {sub, [a] { return run_prepare(*a); }};
}

}  // namespace attograd::cli
