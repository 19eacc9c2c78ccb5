// The communicator's shared parts: the fixed-order sum, agreeing on errors and on settings, the launcher's world
// size and the build id.

#include "train/dist/communicator.h"

#include <xxhash.h>

#include <algorithm>
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

namespace {

// agree_on_settings' fixed sizes: per-setting digests per exchange, the characters of a name and of a value an
// error shows, and a bound on the settings compared (so that a garbled count cannot make the rounds unbounded).
constexpr size_t kDigestsPerRound = 64;
constexpr size_t kNameChars = 60, kShownChars = 200;
constexpr uint64_t kMaxSettings = 1 << 16;
constexpr uint64_t kAbsent = 0x6162736e74ull;  // the digest of a setting this rank does not have

uint64_t digest(const Setting& s) {
  XXH64_state_t* state = XXH64_createState();
  ATTO_CHECK(state != nullptr, "agree_on_settings", "out of memory");
  XXH64_reset(state, 0);
  for (const std::string* part : {&s.name, &s.value}) {
    const uint64_t n = part->size();  // the lengths too: ("ab", "c") is not ("a", "bc")
    XXH64_update(state, &n, sizeof n);
    XXH64_update(state, part->data(), part->size());
  }
  const uint64_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return h;
}

std::string pack(const std::vector<uint64_t>& values) {
  std::string bytes(values.size() * 8, '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// Value i of what a rank sent (`fallback` where it sent fewer bytes: a rank that sends garbage still ends the
// exchange, it only differs).
uint64_t unpack(const std::string& bytes, size_t i, uint64_t fallback) {
  if (bytes.size() < (i + 1) * 8) return fallback;
  uint64_t v;
  std::memcpy(&v, bytes.data() + i * 8, 8);
  return v;
}

// Text of at most `max` characters, on one line.
std::string one_line(const std::string& s, size_t max) {
  std::string out = s.size() > max ? s.substr(0, max - 3) + "..." : s;
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return out;
}

// A fixed-size record: a 4-byte length and `width` bytes, for each of the strings.
std::string record(const std::vector<std::pair<std::string, size_t>>& fields) {
  std::string out;
  for (const auto& [text, width] : fields) {
    const auto n = static_cast<uint32_t>(std::min(text.size(), width));
    out.append(reinterpret_cast<const char*>(&n), 4);
    out.append(text, 0, n);
    out.append(width - n, '\0');
  }
  return out;
}

// Field `index` of a record with fields of the given widths ("" where the bytes are short; lengths clamped).
std::string field(const std::string& bytes, const std::vector<size_t>& widths, size_t index) {
  size_t at = 0;
  for (size_t f = 0; f < index; ++f) at += 4 + widths[f];
  if (bytes.size() < at + 4 + widths[index]) return "";
  uint32_t n;
  std::memcpy(&n, bytes.data() + at, 4);
  return bytes.substr(at + 4, std::min<size_t>(n, widths[index]));
}

// "rank 2" or "ranks 1, 3 and 5" (at most 8 named).
std::string ranks_text(const std::vector<size_t>& ranks) {
  if (ranks.size() == 1) return str_cat("rank ", ranks[0]);
  std::string out = "ranks ";
  const size_t named = std::min<size_t>(ranks.size(), 8);
  for (size_t i = 0; i < named; ++i) out += str_cat(i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ", ranks[i]);
  if (named < ranks.size()) out += str_cat(" and ", ranks.size() - named, " more");
  return out;
}

}  // namespace

void agree_on_settings(Communicator& comm, const std::string& op, const std::vector<Setting>& settings) {
  // Round 1: one digest of every setting, and their count.
  std::vector<uint64_t> digests;
  digests.reserve(settings.size());
  for (const Setting& s : settings) digests.push_back(digest(s));
  const uint64_t count = settings.size();
  const uint64_t all_digest = XXH64(digests.data(), digests.size() * 8, count);
  const std::vector<std::string> round1 = comm.allgather(pack({all_digest, count}));
  const size_t ranks = round1.size();
  bool same = true;
  uint64_t most = 0;
  for (size_t r = 0; r < ranks; ++r) {
    same = same && round1[r] == round1[0];
    most = std::max(most, std::min(unpack(round1[r], 1, kMaxSettings), kMaxSettings));
  }
  if (same) return;

  // Round 2: the per-setting digests, kDigestsPerRound at a time, until the first setting where a rank differs
  // from rank 0. Every rank decides from the same gathered bytes, so every rank runs the same rounds.
  size_t first = SIZE_MAX;
  std::vector<std::string> slots;
  for (size_t at = 0; first == SIZE_MAX && at <= most; at += kDigestsPerRound) {
    std::vector<uint64_t> mine(kDigestsPerRound, kAbsent);
    for (size_t i = 0; i < kDigestsPerRound && at + i < digests.size(); ++i) mine[i] = digests[at + i];
    slots = comm.allgather(pack(mine));
    for (size_t i = 0; first == SIZE_MAX && i < kDigestsPerRound; ++i)
      for (size_t r = 1; r < ranks; ++r)
        if (unpack(slots[r], i, ~unpack(slots[0], i, 0)) != unpack(slots[0], i, 0)) {
          first = at + i;
          break;
        }
  }
  comm.set_failed_together();
  if (first == SIZE_MAX) throw Error(op, "the ranks' settings differ, but no single setting does (a garbled exchange)");

  // Round 3: the name and the value of that setting on every rank.
  const std::vector<size_t> widths{kNameChars, kShownChars};
  const bool have = first < settings.size();
  const Setting none{.name = "", .value = "", .shown = "nothing"};
  const Setting& s = have ? settings[first] : none;
  const std::vector<std::string> named =
      comm.allgather(record({{one_line(s.name, kNameChars), kNameChars},
                             {one_line(s.shown.empty() ? s.value : s.shown, kShownChars), kShownChars}}));
  const size_t slot = first % kDigestsPerRound;
  auto digest_of = [&](size_t r) { return unpack(slots[r], slot, ~unpack(slots[0], slot, 0)); };
  std::string name = field(named[0], widths, 0);
  for (size_t r = 1; name.empty() && r < ranks; ++r) name = field(named[r], widths, 0);
  // Rank 0's value, then each other value with the ranks that have it, in rank order.
  std::string message =
      str_cat("ranks disagree on ", name.empty() ? "a setting" : name, ": rank 0 has ", field(named[0], widths, 1));
  std::vector<uint64_t> values;
  std::vector<std::vector<size_t>> holders;
  for (size_t r = 1; r < ranks; ++r) {
    if (digest_of(r) == digest_of(0)) continue;
    const size_t v = static_cast<size_t>(std::find(values.begin(), values.end(), digest_of(r)) - values.begin());
    if (v == values.size()) {
      values.push_back(digest_of(r));
      holders.emplace_back();
    }
    holders[v].push_back(r);
  }
  const size_t shown = std::min<size_t>(holders.size(), 4);
  for (size_t v = 0; v < shown; ++v)
    message += str_cat(", ", ranks_text(holders[v]), holders[v].size() == 1 ? " has " : " have ",
                       field(named[holders[v][0]], widths, 1));
  if (shown < holders.size()) message += str_cat(", and ", holders.size() - shown, " more values");
  throw Error(op, message);
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
