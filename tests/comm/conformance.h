// Conformance checks shared by the threads suite (comm_conformance_test) and the MPI driver
// (mpi_conformance). Every rank fills its input from (rank, index), runs one collective and
// compares the result with a plain local computation over every rank's input. The inputs are
// small integers, so sums are exact in every dtype (bf16 included) and the comparison is exact.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/core/error.h"
#include "tessel/tensor/dtype.h"

namespace tessel::comm::testing {

enum class Coll {
  kAllreduce,
  kReduceScatter,
  kReduceScatterV,
  kAllgather,
  kAllgatherV,
  kBroadcast,
  kReduce,
  kGather,
  kAllToAll,
  kBarrier
};

inline const char* coll_name(Coll c) {
  switch (c) {
    case Coll::kAllreduce:
      return "allreduce";
    case Coll::kReduceScatter:
      return "reduce_scatter";
    case Coll::kReduceScatterV:
      return "reduce_scatter_v";
    case Coll::kAllgather:
      return "allgather";
    case Coll::kAllgatherV:
      return "allgather_v";
    case Coll::kBroadcast:
      return "broadcast";
    case Coll::kReduce:
      return "reduce";
    case Coll::kGather:
      return "gather";
    case Coll::kAllToAll:
      return "all_to_all";
    case Coll::kBarrier:
      return "barrier";
  }
  return "?";
}

struct Case {
  Coll coll;
  Algorithm algorithm;
  size_t count;  // elements per rank (allreduce/broadcast/reduce: the whole buffer)
  ElemType elem;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;  // broadcast/reduce/gather; taken modulo the world size
};

inline std::string case_name(const Case& c, int world) {
  return str(coll_name(c.coll), "/", algorithm_name(c.algorithm), "/n", world, "/", c.count, "x",
             elem_name(c.elem), "/", reduce_op_name(c.op), "/root", c.root);
}

// Input value of rank r at index i: an integer in [-8, 8] (u8: [0, 16]). Period 4093 in i.
constexpr size_t kPeriod = 4093;
inline int input_value(int r, size_t i, ElemType e) {
  int v = static_cast<int>(((i % kPeriod) * 37 + static_cast<size_t>(r) * 101 + 11) % 4093 % 17);
  return e == ElemType::kU8 ? v : v - 8;
}

inline void store(void* base, size_t i, ElemType e, double v) {
  switch (e) {
    case ElemType::kF32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case ElemType::kF64:
      static_cast<double*>(base)[i] = v;
      break;
    case ElemType::kI32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      break;
    case ElemType::kI64:
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      break;
    case ElemType::kU8:
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v);
      break;
    case ElemType::kBF16:
      static_cast<uint16_t*>(base)[i] = f32_to_bf16(static_cast<float>(v));
      break;
    case ElemType::kF16:
      static_cast<uint16_t*>(base)[i] = f32_to_f16(static_cast<float>(v));
      break;
  }
}

inline double load(const void* base, size_t i, ElemType e) {
  switch (e) {
    case ElemType::kF32:
      return static_cast<const float*>(base)[i];
    case ElemType::kF64:
      return static_cast<const double*>(base)[i];
    case ElemType::kI32:
      return static_cast<const int32_t*>(base)[i];
    case ElemType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case ElemType::kU8:
      return static_cast<const uint8_t*>(base)[i];
    case ElemType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case ElemType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
  }
  return 0;
}

// The reduction of every rank's input_value at index i, as the dtype stores it.
inline double expected_reduction(int n, size_t i, ElemType e, ReduceOp op) {
  long acc = input_value(0, i, e);
  for (int r = 1; r < n; ++r) {
    long v = input_value(r, i, e);
    acc = op == ReduceOp::kMax   ? std::max(acc, v)
          : op == ReduceOp::kMin ? std::min(acc, v)
                                 : acc + v;
  }
  if (op != ReduceOp::kAvg) return static_cast<double>(acc);
  switch (e) {
    case ElemType::kI32:
    case ElemType::kI64:
      return static_cast<double>(acc / n);
    case ElemType::kF64:
      return static_cast<double>(acc) / n;
    default: {  // f32 arithmetic, then rounded to the storage type
      float f = static_cast<float>(acc) / static_cast<float>(n);
      if (e == ElemType::kBF16) return bf16_to_f32(f32_to_bf16(f));
      if (e == ElemType::kF16) return f16_to_f32(f32_to_f16(f));
      return f;
    }
  }
}

// Reduction table over one period (the inputs repeat with period kPeriod in the index).
inline std::vector<double> reduction_table(int n, ElemType e, ReduceOp op) {
  std::vector<double> t(kPeriod);
  for (size_t i = 0; i < kPeriod; ++i) t[i] = expected_reduction(n, i, e, op);
  return t;
}

// Block sizes of the variable-size cases: uneven, with empty blocks when count is small.
inline std::vector<size_t> variable_counts(size_t count, int n) {
  std::vector<size_t> out(n);
  for (int j = 0; j < n; ++j) out[j] = j % 2 ? count / 2 : count + static_cast<size_t>(j);
  return out;
}

// Runs the case on this rank; returns "" or a description of the first wrong element.
inline std::string run_case(Communicator& comm, const Case& c) {
  const int n = comm.size(), r = comm.rank(), root = c.root % n;
  const ElemType e = c.elem;
  const size_t es = elem_size(e);
  CallOptions opt;
  opt.algorithm = c.algorithm;
  auto wrong = [&](const char* what, size_t i, double got, double want) {
    return str(case_name(c, n), ": rank ", r, " ", what, "[", i, "] = ", got, ", want ", want);
  };
  auto fill = [&](std::vector<char>& buf, size_t count, int who, size_t offset) {
    buf.assign(count * es, 0);
    for (size_t i = 0; i < count; ++i) store(buf.data(), i, e, input_value(who, offset + i, e));
  };
  std::vector<char> in, out;
  switch (c.coll) {
    case Coll::kAllreduce: {
      fill(in, c.count, r, 0);
      comm.allreduce(in.data(), c.count, e, c.op, opt);
      std::vector<double> t = reduction_table(n, e, c.op);
      for (size_t i = 0; i < c.count; ++i)
        if (load(in.data(), i, e) != t[i % kPeriod])
          return wrong("out", i, load(in.data(), i, e), t[i % kPeriod]);
      return "";
    }
    case Coll::kReduceScatter:
    case Coll::kReduceScatterV: {
      std::vector<size_t> counts = c.coll == Coll::kReduceScatter ? std::vector<size_t>(n, c.count)
                                                                  : variable_counts(c.count, n);
      size_t total = 0, off = 0;
      for (int j = 0; j < n; ++j) {
        if (j < r) off += counts[j];
        total += counts[j];
      }
      fill(in, total, r, 0);
      std::vector<char> keep = in;
      out.assign(counts[r] * es, 0);
      comm.reduce_scatter(in.data(), out.data(), counts, e, c.op, opt);
      std::vector<double> t = reduction_table(n, e, c.op);
      for (size_t k = 0; k < counts[r]; ++k)
        if (load(out.data(), k, e) != t[(off + k) % kPeriod])
          return wrong("out", k, load(out.data(), k, e), t[(off + k) % kPeriod]);
      if (in != keep) return str(case_name(c, n), ": rank ", r, " input was modified");
      // In place: out is this rank's own block of in.
      char* own = in.data() + off * es;
      comm.reduce_scatter(in.data(), own, counts, e, c.op, opt);
      for (size_t k = 0; k < counts[r]; ++k)
        if (load(own, k, e) != t[(off + k) % kPeriod])
          return wrong("in-place out", k, load(own, k, e), t[(off + k) % kPeriod]);
      return "";
    }
    case Coll::kAllgather:
    case Coll::kAllgatherV: {
      std::vector<size_t> counts = c.coll == Coll::kAllgather ? std::vector<size_t>(n, c.count)
                                                              : variable_counts(c.count, n);
      size_t total = 0;
      for (size_t x : counts) total += x;
      fill(in, counts[r], r, 0);
      out.assign(total * es, 0);
      comm.allgather(in.data(), out.data(), counts, e, opt);
      size_t at = 0;
      for (int j = 0; j < n; ++j)
        for (size_t k = 0; k < counts[j]; ++k, ++at)
          if (load(out.data(), at, e) != input_value(j, k, e))
            return wrong("out", at, load(out.data(), at, e), input_value(j, k, e));
      return "";
    }
    case Coll::kBroadcast: {
      fill(in, c.count, r, 0);
      if (r != root)
        for (size_t i = 0; i < c.count; ++i) store(in.data(), i, e, 3);
      comm.broadcast(in.data(), c.count, e, root, opt);
      for (size_t i = 0; i < c.count; ++i)
        if (load(in.data(), i, e) != input_value(root, i, e))
          return wrong("buf", i, load(in.data(), i, e), input_value(root, i, e));
      return "";
    }
    case Coll::kReduce: {
      fill(in, c.count, r, 0);
      comm.reduce(in.data(), c.count, e, c.op, root, opt);
      std::vector<double> t = reduction_table(n, e, c.op);
      for (size_t i = 0; i < c.count; ++i) {
        double want = r == root ? t[i % kPeriod] : input_value(r, i, e);
        if (load(in.data(), i, e) != want) return wrong("buf", i, load(in.data(), i, e), want);
      }
      return "";
    }
    case Coll::kGather: {
      fill(in, c.count, r, 0);
      out.assign(r == root ? n * c.count * es : 0, 0);
      comm.gather(in.data(), out.data(), c.count, e, root, opt);
      if (r != root) return "";
      for (int j = 0; j < n; ++j)
        for (size_t k = 0; k < c.count; ++k)
          if (load(out.data(), j * c.count + k, e) != input_value(j, k, e))
            return wrong("out", j * c.count + k, load(out.data(), j * c.count + k, e),
                         input_value(j, k, e));
      return "";
    }
    case Coll::kAllToAll: {
      fill(in, n * c.count, r, 0);
      out.assign(n * c.count * es, 0);
      comm.all_to_all(in.data(), out.data(), c.count, e, opt);
      for (int j = 0; j < n; ++j)
        for (size_t k = 0; k < c.count; ++k) {
          double want = input_value(j, r * c.count + k, e);
          if (load(out.data(), j * c.count + k, e) != want)
            return wrong("out", j * c.count + k, load(out.data(), j * c.count + k, e), want);
        }
      return "";
    }
    case Coll::kBarrier:
      comm.barrier(opt);
      return "";
  }
  return "unknown collective";
}

}  // namespace tessel::comm::testing
