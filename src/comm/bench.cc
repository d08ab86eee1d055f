// `tessel bench comm` (see bench.h). Every rank runs the same schedule; per-iteration times are
// combined with a max over ranks (a collective ends when its last rank does), then the median
// over repeats is reported.
#include "tessel/comm/bench.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>

#include "tessel/comm/mpi.h"
#include "tessel/comm/threads.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"

namespace tessel::comm {
namespace {

struct Point {
  std::string coll;
  Algorithm algorithm;
  Algorithm resolved;
  size_t bytes = 0;
  double median_s = 0;
  double factor = 1;  // busbw / algbw
  bool ok = true;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Single-thread memcpy bandwidth (bytes copied per second) over `bytes`, median of 7.
double memcpy_bandwidth(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<double> t;
  for (int i = 0; i < 8; ++i) {
    double t0 = now_seconds();
    std::memcpy(b.data(), a.data(), bytes);
    double dt = now_seconds() - t0;
    if (i > 0) t.push_back(dt);  // the first pass pays the page faults
    a[i] = b[bytes - 1 - i];     // keep the copies observable
  }
  return static_cast<double>(bytes) / median(t);
}

OpKind op_of(const std::string& coll) {
  if (coll == "allreduce") return OpKind::kAllreduce;
  if (coll == "reduce_scatter") return OpKind::kReduceScatter;
  if (coll == "allgather") return OpKind::kAllgather;
  throw InvalidArgument(str("bench comm: unknown collective, got '", coll,
                            "'; use allreduce, reduce_scatter or allgather"));
}

int default_repeats(size_t bytes) {
  if (bytes < (1u << 20)) return 50;
  if (bytes < (16u << 20)) return 20;
  return 7;
}

// Runs one call of `coll` with `a`; `in`/`out` hold `bytes` (see bench.h for the convention).
void call(Communicator& c, const std::string& coll, Algorithm a, char* in, char* out, size_t count,
          ElemType e) {
  CallOptions o;
  o.algorithm = a;
  const size_t per_rank = count / static_cast<size_t>(c.size());
  if (coll == "allreduce")
    c.allreduce(in, count, e, ReduceOp::kSum, o);
  else if (coll == "reduce_scatter")
    c.reduce_scatter(in, out, per_rank, e, ReduceOp::kSum, o);
  else
    c.allgather(in + c.rank() * per_rank * elem_size(e), out, per_rank, e, o);
}

// Fills inputs with small integers, runs once and checks every element exactly.
bool verify(Communicator& c, const std::string& coll, Algorithm a, char* in, char* out,
            size_t count, ElemType e) {
  const int n = c.size(), r = c.rank();
  auto value = [](int rank, size_t i) { return static_cast<int>((i * 7 + rank * 3) % 11) - 5; };
  auto put = [&](char* p, size_t i, int v) {
    if (e == ElemType::kF32)
      reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
    else if (e == ElemType::kF64)
      reinterpret_cast<double*>(p)[i] = v;
    else if (e == ElemType::kI32)
      reinterpret_cast<int32_t*>(p)[i] = v;
    else if (e == ElemType::kI64)
      reinterpret_cast<int64_t*>(p)[i] = v;
    else if (e == ElemType::kBF16)
      reinterpret_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v));
    else
      reinterpret_cast<uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(v));
  };
  auto get = [&](const char* p, size_t i) -> double {
    if (e == ElemType::kF32) return reinterpret_cast<const float*>(p)[i];
    if (e == ElemType::kF64) return reinterpret_cast<const double*>(p)[i];
    if (e == ElemType::kI32) return reinterpret_cast<const int32_t*>(p)[i];
    if (e == ElemType::kI64) return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
    if (e == ElemType::kBF16) return bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
    return f16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
  };
  auto sum = [&](size_t i) {
    int s = 0;
    for (int k = 0; k < n; ++k) s += value(k, i);
    return static_cast<double>(s);
  };
  for (size_t i = 0; i < count; ++i) put(in, i, value(r, i));
  call(c, coll, a, in, out, count, e);
  const size_t per_rank = count / static_cast<size_t>(n);
  bool ok = true;
  if (coll == "allreduce") {
    for (size_t i = 0; i < count && ok; ++i) ok = get(in, i) == sum(i);
  } else if (coll == "reduce_scatter") {
    for (size_t k = 0; k < per_rank && ok; ++k) ok = get(out, k) == sum(r * per_rank + k);
  } else {
    // allgather: rank j's block is its own input at the same offsets.
    for (size_t i = 0; i < per_rank * n && ok; ++i)
      ok = get(out, i) == value(static_cast<int>(i / per_rank), i);
  }
  return ok;
}

// One rank's part of the whole bench; returns the points (meaningful on rank 0).
std::vector<Point> bench_rank(Communicator& c, const CommBenchOptions& o,
                              const std::vector<Algorithm>& algos) {
  const int n = c.size();
  const ElemType e = o.elem;
  const size_t es = elem_size(e);
  std::vector<Point> points;
  for (const std::string& coll : o.collectives) {
    const OpKind op = op_of(coll);
    for (size_t size : o.sizes) {
      const size_t count = std::max<size_t>(1, size / es / n) * n;  // divisible by n
      const size_t bytes = count * es;
      std::vector<Algorithm> use;
      for (Algorithm a : algos) {
        try {
          c.choose(op, bytes, a);
          use.push_back(a);
        } catch (const InvalidArgument&) {  // not available for this collective/backend
        }
      }
      std::unique_ptr<char[]> in(new char[bytes]()), out(new char[bytes]());
      const int reps = o.repeats > 0 ? o.repeats : default_repeats(bytes);
      std::vector<std::vector<double>> t(use.size(), std::vector<double>(reps));
      for (size_t k = 0; k < use.size(); ++k)  // warm-up: page faults, scratch growth
        call(c, coll, use[k], in.get(), out.get(), count, e);
      for (int rep = 0; rep < reps; ++rep)
        for (size_t k = 0; k < use.size(); ++k) {
          c.barrier();
          double t0 = now_seconds();
          call(c, coll, use[k], in.get(), out.get(), count, e);
          t[k][rep] = now_seconds() - t0;
        }
      for (size_t k = 0; k < use.size(); ++k) {
        Point p;
        p.coll = coll;
        p.algorithm = use[k];
        p.resolved = c.choose(op, bytes, use[k]);
        p.bytes = bytes;
        c.allreduce(t[k].data(), t[k].size(), ElemType::kF64, ReduceOp::kMax);
        p.median_s = median(t[k]);
        p.factor = op == OpKind::kAllreduce ? 2.0 * (n - 1) / n : 1.0 * (n - 1) / n;
        int ok = verify(c, coll, use[k], in.get(), out.get(), count, e) ? 1 : 0;
        c.allreduce(&ok, 1, ElemType::kI32, ReduceOp::kMin);
        p.ok = ok == 1;
        points.push_back(p);
      }
    }
  }
  return points;
}

void print(const CommBenchOptions& o, int n, double memcpy_bw, const std::vector<Point>& pts) {
  std::printf("comm bench: backend %s, %d ranks, %s, %u cores%s%s\n", o.backend.c_str(), n,
              elem_name(o.elem), std::max(1u, std::thread::hardware_concurrency()),
              o.backend == "mpi" ? ", " : "", o.backend == "mpi" ? mpi_thread_level() : "");
  std::printf("memcpy (1 thread, same run): %.2f GB/s\n", memcpy_bw / 1e9);
  std::printf("%-15s %-22s %10s %12s %11s %11s %9s %s\n", "collective", "algorithm", "size",
              "median_us", "algbw_GB/s", "busbw_GB/s", "%memcpy", "check");
  for (const Point& p : pts) {
    double algbw = p.bytes / p.median_s / 1e9, busbw = algbw * p.factor;
    std::string name = algorithm_name(p.algorithm);
    if (p.algorithm == Algorithm::kAuto) name += str("->", algorithm_name(p.resolved));
    std::printf("%-15s %-22s %10s %12.1f %11.3f %11.3f %8.1f%% %s\n", p.coll.c_str(), name.c_str(),
                format_bytes(p.bytes).c_str(), p.median_s * 1e6, algbw, busbw,
                100.0 * busbw * 1e9 / memcpy_bw, p.ok ? "ok" : "FAILED");
  }
  std::fflush(stdout);
}

void write_json(const CommBenchOptions& o, int n, double memcpy_bw, const std::vector<Point>& pts) {
  std::ofstream f(o.json_path);
  if (!f)
    throw IoError(str("bench comm: cannot write JSON, got path '", o.json_path,
                      "'; check that its folder exists and is writable"));
  f << "{\n  \"backend\": \"" << o.backend << "\", \"ranks\": " << n << ", \"dtype\": \""
    << elem_name(o.elem) << "\", \"memcpy_GBps\": " << memcpy_bw / 1e9 << ",\n  \"results\": [";
  for (size_t i = 0; i < pts.size(); ++i) {
    const Point& p = pts[i];
    double algbw = p.bytes / p.median_s / 1e9;
    f << (i ? ",\n    " : "\n    ") << "{\"collective\": \"" << p.coll << "\", \"algorithm\": \""
      << algorithm_name(p.algorithm) << "\", \"resolved\": \"" << algorithm_name(p.resolved)
      << "\", \"bytes\": " << p.bytes << ", \"median_us\": " << p.median_s * 1e6
      << ", \"algbw_GBps\": " << algbw << ", \"busbw_GBps\": " << algbw * p.factor
      << ", \"ok\": " << (p.ok ? "true" : "false") << "}";
  }
  f << "\n  ]\n}\n";
}

}  // namespace

int run_comm_bench(const CommBenchOptions& o) {
  if (o.backend != "threads" && o.backend != "mpi")
    throw InvalidArgument(
        str("bench comm: unknown backend, got '", o.backend, "'; use threads or mpi"));
  if (o.sizes.empty() || o.collectives.empty())
    throw InvalidArgument("bench comm: no sizes or no collectives given; e.g. --sizes 4KiB..64MiB");
  for (const std::string& coll : o.collectives) op_of(coll);
  std::vector<Algorithm> algos = o.algorithms;
  if (algos.empty()) {
    algos = {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree, Algorithm::kDirect};
    if (o.backend == "mpi") algos.push_back(Algorithm::kNative);
  }
  CommOptions copt;
  if (o.segment_bytes) copt.segment_bytes = o.segment_bytes;
  if (o.in_flight) copt.in_flight = o.in_flight;
  const size_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
  const size_t memcpy_bytes = std::max<size_t>(largest, 64u << 20);

  std::vector<Point> points;
  double memcpy_bw = 0;
  int n = 0;
  if (o.backend == "threads") {
    if (o.workers < 1)
      throw InvalidArgument(str("bench comm: --workers must be >= 1, got ", o.workers));
    memcpy_bw = memcpy_bandwidth(memcpy_bytes);
    n = o.workers;
    run_threads(
        o.workers,
        [&](Communicator& c) {
          auto p = bench_rank(c, o, algos);
          if (c.rank() == 0) points = std::move(p);
        },
        copt);
    memcpy_bw = std::max(memcpy_bw, memcpy_bandwidth(memcpy_bytes));  // before and after
  } else {
    Communicator c = mpi_world(copt);
    n = c.size();
    // Rank 0 measures while the others wait in a barrier.
    if (c.rank() == 0) memcpy_bw = memcpy_bandwidth(memcpy_bytes);
    c.barrier();
    points = bench_rank(c, o, algos);
    c.barrier();
    if (c.rank() == 0) memcpy_bw = std::max(memcpy_bw, memcpy_bandwidth(memcpy_bytes));
    c.barrier();
    if (c.rank() != 0)
      return std::all_of(points.begin(), points.end(), [](const Point& p) { return p.ok; }) ? 0 : 1;
  }
  print(o, n, memcpy_bw, points);
  if (!o.json_path.empty()) write_json(o, n, memcpy_bw, points);
  return std::all_of(points.begin(), points.end(), [](const Point& p) { return p.ok; }) ? 0 : 1;
}

}  // namespace tessel::comm
