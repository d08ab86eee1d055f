// Vocabulary of the communication layer: element types, reduction operators, algorithm names
// and deadlines. Plain values, no state; everything here is thread safe.
// ElemType is the comm area's own element type because collectives also move f64, which tensors
// do not store; elem_type(DType) converts. bf16 and f16 are reduced in f32 and rounded back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tessel/core/names.h"
#include "tessel/tensor/dtype.h"

namespace tessel::comm {

enum class ElemType : uint8_t { kF32, kF64, kF16, kBF16, kI32, kI64, kU8 };

size_t elem_size(ElemType t);
const char* elem_name(ElemType t);  // "f32", "f64", "f16", "bf16", "i32", "i64", "u8"
ElemType elem_type(DType t);        // a tensor dtype as a comm element type
ElemType elem_type_from_name(const std::string& name);  // throws InvalidArgument

// kAvg is a sum divided by the world size after the reduction (integer division for i32/i64).
// u8 supports max and min only (it is for moving bytes, not for arithmetic).
enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin };
const char* reduce_op_name(ReduceOp op);

// Which library moves the bytes: ranks as threads of one process, or MPI processes.
enum class Backend : uint8_t { kThreads, kMpi };
const char* backend_name(Backend b);  // "threads", "mpi"

// How a collective moves its data. kAuto picks by collective, message size and world size (see
// AutoThresholds in communicator.h); kNative delegates to the transport's library (MPI).
enum class Algorithm : uint8_t { kAuto, kRing, kHalvingDoubling, kTree, kDirect, kNative };
const char* algorithm_name(Algorithm a);  // "auto", "ring", "halving_doubling", "tree", ...
Algorithm algorithm_from_name(const std::string& name);  // also accepts "hd"
// "ring,tree" -> {kRing, kTree}; throws InvalidArgument naming the valid names.
std::vector<Algorithm> parse_algorithms(const std::string& list);

// An absolute point on the steady clock (now_seconds()); never() is infinitely far away.
class Deadline {
 public:
  static Deadline after(double seconds);  // now + seconds; inf or >= 1e9 s means never
  static Deadline never() { return Deadline(std::numeric_limits<double>::infinity()); }

  double when() const { return at_; }
  bool is_never() const { return at_ == std::numeric_limits<double>::infinity(); }
  bool expired() const;
  double remaining_s() const;  // <= 0 once expired

 private:
  explicit Deadline(double at) : at_(at) {}
  double at_;
};

// "4KiB" -> 4096, "1MiB" -> 1048576, "64MB" -> 64000000, "100" -> 100.
size_t parse_bytes(const std::string& text);
// "4KiB..64MiB" -> every power of 4 from 4 KiB to 64 MiB; "4KiB,1MiB" -> those two; mixed lists
// of single sizes and ranges are allowed. Throws InvalidArgument on malformed input.
std::vector<size_t> parse_size_list(const std::string& text);

}  // namespace tessel::comm

namespace tessel {
TESSEL_NAMES(comm::Algorithm, "auto", "ring", "halving_doubling", "tree", "direct", "native");
}  // namespace tessel
