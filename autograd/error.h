#pragma once
// The project's one exception type and the helpers that format its messages.

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace attograd {

/// Every user error (bad shape, bad axis, bad dtype, bad file, bad option) throws this.
class Error : public std::runtime_error {
 public:
  /// `op` names the operation, `what` says what was wrong.
  Error(const std::string& op, const std::string& what) : std::runtime_error(op + ": " + what), op_(op) {}
  /// The operation that raised the error (e.g. "matmul").
  const std::string& op() const { return op_; }

 private:
  std::string op_;
};

/// Formats a shape as "[2, 3, 4]".
inline std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace detail {
inline void cat_to(std::ostringstream&) {}
template <class A, class... R>
void cat_to(std::ostringstream& os, const A& a, const R&... rest) {
  if constexpr (std::is_same_v<A, std::vector<int64_t>>) os << shape_str(a);
  else os << a;
  cat_to(os, rest...);
}
}  // namespace detail

/// Concatenates the arguments into a message; shapes (std::vector<int64_t>) print as [a, b].
template <class... A>
std::string str_cat(const A&... a) {
  std::ostringstream os;
  detail::cat_to(os, a...);
  return os.str();
}

}  // namespace attograd

/// Throws attograd::Error(op, message...) unless `cond` holds.
#define ATTO_CHECK(cond, op, ...)                                  \
  do {                                                             \
    if (!(cond)) throw ::attograd::Error((op), ::attograd::str_cat(__VA_ARGS__)); \
  } while (0)
