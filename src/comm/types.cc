#include "tessel/comm/types.h"

#include <cctype>
#include <cmath>
#include <iterator>

#include "tessel/core/clock.h"
#include "tessel/core/error.h"

namespace tessel::comm {

namespace {
// Per ElemType, in the enum's order.
constexpr size_t kElemSizes[] = {4, 8, 2, 2, 4, 8, 1};
constexpr const char* kElemNames[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
constexpr const char* kReduceOpNames[] = {"sum", "avg", "max", "min"};
}  // namespace

size_t elem_size(ElemType t) { return kElemSizes[static_cast<size_t>(t)]; }

const char* elem_name(ElemType t) { return kElemNames[static_cast<size_t>(t)]; }

ElemType elem_type(DType t) {
  constexpr ElemType kOfDType[] = {ElemType::kF32, ElemType::kF16, ElemType::kBF16,
                                   ElemType::kI32, ElemType::kI64, ElemType::kU8};
  return kOfDType[static_cast<size_t>(t)];
}

ElemType elem_type_from_name(const std::string& name) {
  for (size_t i = 0; i < std::size(kElemNames); ++i)
    if (name == kElemNames[i]) return static_cast<ElemType>(i);
  throw InvalidArgument(
      str("comm: unknown dtype, got '", name, "'; use one of f32, f64, f16, bf16, i32, i64, u8"));
}

const char* reduce_op_name(ReduceOp op) { return kReduceOpNames[static_cast<size_t>(op)]; }

const char* backend_name(Backend b) { return b == Backend::kMpi ? "mpi" : "threads"; }

const char* algorithm_name(Algorithm a) { return name_of(a); }

Algorithm algorithm_from_name(const std::string& name) {
  if (name == "hd" || name == "halving-doubling") return Algorithm::kHalvingDoubling;
  if (const std::optional<Algorithm> a = value_of<Algorithm>(name)) return *a;
  throw InvalidArgument(str("comm: unknown algorithm, got '", name,
                            "'; use one of auto, ring, halving_doubling (hd), tree, direct, "
                            "native"));
}

namespace {
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (!std::isspace(static_cast<unsigned char>(c))) {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}
}  // namespace

std::vector<Algorithm> parse_algorithms(const std::string& list) {
  std::vector<Algorithm> out;
  for (const std::string& name : split_list(list)) out.push_back(algorithm_from_name(name));
  if (out.empty())
    throw InvalidArgument(str("comm: empty algorithm list, got '", list,
                              "'; give names like ring,halving_doubling,tree,direct,native"));
  return out;
}

Deadline Deadline::after(double seconds) {
  if (!(seconds < 1e9)) return never();
  return Deadline(now_seconds() + seconds);
}

bool Deadline::expired() const { return !is_never() && now_seconds() >= at_; }

double Deadline::remaining_s() const { return is_never() ? at_ : at_ - now_seconds(); }

size_t parse_bytes(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  std::string num = text.substr(0, i), unit = text.substr(i);
  double mult = 0;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "KiB" || unit == "K" || unit == "k")
    mult = 1024.0;
  else if (unit == "MiB" || unit == "M")
    mult = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "KB" || unit == "kB")
    mult = 1e3;
  else if (unit == "MB")
    mult = 1e6;
  else if (unit == "GB")
    mult = 1e9;
  if (num.empty() || mult == 0)
    throw InvalidArgument(str("comm: bad size, got '", text,
                              "'; write a number with an optional unit: 4096, 4KiB, 1MiB, 64MB"));
  return static_cast<size_t>(std::llround(std::stod(num) * mult));
}

std::vector<size_t> parse_size_list(const std::string& text) {
  std::vector<size_t> out;
  for (const std::string& item : split_list(text)) {
    size_t dots = item.find("..");
    if (dots == std::string::npos) {
      out.push_back(parse_bytes(item));
      continue;
    }
    // "lo..hi" or "lo..hi:factor" (factor 4 by default).
    std::string rest = item.substr(dots + 2);
    size_t factor = 4;
    if (size_t colon = rest.find(':'); colon != std::string::npos) {
      factor = parse_bytes(rest.substr(colon + 1));
      rest = rest.substr(0, colon);
    }
    size_t lo = parse_bytes(item.substr(0, dots)), hi = parse_bytes(rest);
    if (lo == 0 || hi < lo || factor < 2)
      throw InvalidArgument(str("comm: bad size range, got '", item,
                                "'; write lo..hi with 0 < lo <= hi, e.g. 4KiB..64MiB"));
    for (size_t s = lo; s <= hi; s *= factor) out.push_back(s);
  }
  if (out.empty())
    throw InvalidArgument(str("comm: empty size list, got '", text, "'; e.g. 4KiB..64MiB"));
  return out;
}

}  // namespace tessel::comm
