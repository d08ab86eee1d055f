#include "inputs_json.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <vector>

namespace tessel::infer {
namespace {

bool digit(char c) { return c >= '0' && c <= '9'; }

constexpr double kPow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                             1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

// A cursor over the body; every step returns false on what the fast path does not take.
class Cursor {
 public:
  explicit Cursor(std::string_view s) : p_(s.data()), end_(s.data() + s.size()) {}

  // The next token is `c` (consumed).
  bool eat(char c) {
    skip_space();
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  // The next characters are `s` exactly (consumed), no whitespace first.
  bool exact(std::string_view s) {
    if (static_cast<size_t>(end_ - p_) < s.size() || std::memcmp(p_, s.data(), s.size()) != 0)
      return false;
    p_ += s.size();
    return true;
  }
  // A string without escapes, into *out.
  bool string(std::string_view* out) {
    if (!eat('"')) return false;
    const char* q = p_;
    while (q < end_ && *q != '"' && *q != '\\') ++q;
    if (q == end_ || *q != '"') return false;
    *out = std::string_view(p_, static_cast<size_t>(q - p_));
    p_ = q + 1;
    return true;
  }
  // A non-negative integer of up to 15 digits.
  bool integer(int64_t* out) {
    skip_space();
    const char* q = digits(p_);
    if (q == p_ || q - p_ > 15) return false;
    std::from_chars(p_, q, *out);
    p_ = q;
    return true;
  }
  // A JSON array of what Read(T*) reads, appended to *out (Read a template argument, so that
  // it inlines: the cost of a call per number was a quarter of the reader's).
  template <auto Read, typename T>
  bool array(std::vector<T>* out) {
    if (!eat('[')) return false;
    if (eat(']')) return true;
    do {
      T v{};
      if (!(this->*Read)(&v)) return false;
      out->push_back(v);
    } while (eat(','));
    return eat(']');
  }
  bool at_end() {
    skip_space();
    return p_ == end_;
  }
  // A number in JSON's grammar, -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, as
  // nlohmann::json reads it and get<float>() rounds it: an integer as a 64-bit integer (longer
  // ones, which it may keep unsigned, are left to it), anything else as a double. One pass
  // gathers the digits m and the power of ten e; Clinger's fast path then takes m of at most
  // 15 digits (an exact double) with e within 10^+-22 (exact too): m * 10^e is one correctly
  // rounded operation, the double from_chars reads (a quarter of its cost); the rest is left
  // to from_chars.
  bool number(float* out) {
    skip_space();
    const char* q = p_;
    const bool negative = q < end_ && *q == '-';
    q += negative;
    if (q == end_ || !digit(*q)) return false;
    uint64_t m = 0;
    int n = 0, e = 0;  // n: digits in m (up to 19 exact in 64 bits; more only count)
    if (*q == '0')
      ++q;
    else
      for (; q < end_ && digit(*q); ++q, ++n) m = m * 10 + static_cast<uint64_t>(*q - '0');
    const bool integer = q == end_ || (*q != '.' && *q != 'e' && *q != 'E');
    if (q < end_ && *q == '.') {
      if (++q == end_ || !digit(*q)) return false;
      for (; q < end_ && digit(*q); ++q, ++n, --e) m = m * 10 + static_cast<uint64_t>(*q - '0');
    }
    if (q < end_ && (*q == 'e' || *q == 'E')) {
      const bool down = ++q < end_ && *q == '-';
      if (q < end_ && (*q == '+' || *q == '-')) ++q;
      if (q == end_ || !digit(*q)) return false;
      int x = 0;
      for (; q < end_ && digit(*q); ++q) x = std::min(x * 10 + (*q - '0'), 100000);
      e += down ? -x : x;
    }
    if (integer) {
      if (n > 15) return false;
      *out = static_cast<float>(negative ? -static_cast<int64_t>(m) : static_cast<int64_t>(m));
    } else if (n <= 15 && e >= -22 && e <= 22) {
      const double v =
          e < 0 ? static_cast<double>(m) / kPow10[-e] : static_cast<double>(m) * kPow10[e];
      *out = static_cast<float>(negative ? -v : v);
    } else {
      double v = 0;
      const auto got = std::from_chars(p_, q, v);
      if (got.ec != std::errc() || got.ptr != q) return false;  // out of range too
      *out = static_cast<float>(v);
    }
    p_ = q;
    return true;
  }

 private:
  void skip_space() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  const char* digits(const char* q) const {
    while (q < end_ && digit(*q)) ++q;
    return q;
  }

  const char* p_;
  const char* end_;
};

}  // namespace

Tensor read_inputs(std::string_view body, const Shape& row, int64_t max_rows) {
  const int64_t numel = shape_numel(row);
  Cursor c(body);
  if (!c.eat('{') || !c.eat('"') || !c.exact("inputs\"") || !c.eat(':') || !c.eat('[')) return {};
  std::vector<float> values;
  values.reserve(static_cast<size_t>(numel));
  int64_t rows = 0;
  do {
    if (!c.eat('[') || ++rows > max_rows) return {};
    for (int64_t j = 0; j < numel; ++j) {
      float v;
      if ((j > 0 && !c.eat(',')) || !c.number(&v)) return {};
      values.push_back(v);
    }
    if (!c.eat(']')) return {};
  } while (c.eat(','));
  if (!c.eat(']') || !c.eat('}') || !c.at_end()) return {};
  Shape shape = row;
  shape.insert(shape.begin(), rows);
  Tensor x = Tensor::empty(shape);
  std::memcpy(x.raw(), values.data(), values.size() * sizeof(float));
  return x;
}

Tensor read_v2_inputs(std::string_view body, const Shape& row, int64_t max_rows) {
  Cursor c(body);
  std::string_view key, name, datatype;
  std::vector<int64_t> shape;
  std::vector<float> values;
  values.reserve(static_cast<size_t>(shape_numel(row)));
  if (!c.eat('{') || !c.string(&key) || key != "inputs" || !c.eat(':') || !c.eat('[') ||
      !c.eat('{'))
    return {};
  do {
    if (!c.string(&key) || !c.eat(':')) return {};
    const bool ok = key == "name"       ? c.string(&name)
                    : key == "datatype" ? c.string(&datatype)
                    : key == "shape"    ? shape.empty() && c.array<&Cursor::integer>(&shape)
                    : key == "data"     ? values.empty() && c.array<&Cursor::number>(&values)
                                        : false;
    if (!ok) return {};
  } while (c.eat(','));
  if (!c.eat('}') || !c.eat(']') || !c.eat('}') || !c.at_end()) return {};
  if (name != "input" || datatype != "FP32" || shape.size() != row.size() + 1) return {};
  Shape want = row;
  want.insert(want.begin(), shape[0]);
  if (shape != want || shape[0] < 1 || shape[0] > max_rows ||
      static_cast<int64_t>(values.size()) != shape_numel(want))
    return {};
  Tensor x = Tensor::empty(want);
  std::memcpy(x.raw(), values.data(), values.size() * sizeof(float));
  return x;
}

}  // namespace tessel::infer
