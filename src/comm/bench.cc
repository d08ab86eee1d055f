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
  bool in_place = true;
  size_t bytes = 0, count = 0;
  double median_s = 0;
  double factor = 1;  // busbw / algbw
  int64_t wrong = 0;  // elements that failed verification (over every rank)
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

// One variant of a collective: its algorithm, and whether the output overlaps the input.
struct Variant {
  Algorithm algorithm;
  bool in_place;
};

// The buffers of a point: `bytes` each (see bench.h for the size convention).
struct Buffers {
  std::unique_ptr<char[]> in, out;
};

// Runs one call of `coll`. In place: allreduce on `in`; reduce-scatter into this rank's block
// of `in`; allgather from this rank's block of `out`. Out of place: `in` to `out`.
void call(Communicator& c, const std::string& coll, const Variant& v, Buffers& b, size_t count,
          ElemType e) {
  CallOptions o;
  o.algorithm = v.algorithm;
  const size_t per_rank = count / static_cast<size_t>(c.size());
  const size_t mine = c.rank() * per_rank * elem_size(e);
  if (coll == "allreduce")
    c.allreduce(b.in.get(), count, e, ReduceOp::kSum, o);
  else if (coll == "reduce_scatter")
    c.reduce_scatter(b.in.get(), v.in_place ? b.in.get() + mine : b.out.get(), per_rank, e,
                     ReduceOp::kSum, o);
  else
    c.allgather(v.in_place ? b.out.get() + mine : b.in.get() + mine, b.out.get(), per_rank, e, o);
}

// Fills inputs with small integers, runs once and counts the elements that differ from a
// local reduction.
int64_t count_wrong(Communicator& c, const std::string& coll, const Variant& v, Buffers& b,
                    size_t count, ElemType e) {
  const int n = c.size(), r = c.rank();
  auto value = [](int rank, size_t i) { return static_cast<int>((i * 7 + rank * 3) % 11) - 5; };
  auto put = [&](char* p, size_t i, int x) {
    if (e == ElemType::kF32)
      reinterpret_cast<float*>(p)[i] = static_cast<float>(x);
    else if (e == ElemType::kF64)
      reinterpret_cast<double*>(p)[i] = x;
    else if (e == ElemType::kI32)
      reinterpret_cast<int32_t*>(p)[i] = x;
    else if (e == ElemType::kI64)
      reinterpret_cast<int64_t*>(p)[i] = x;
    else if (e == ElemType::kBF16)
      reinterpret_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(x));
    else
      reinterpret_cast<uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(x));
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
  const size_t per_rank = count / static_cast<size_t>(n);
  // The inputs: allgather's in-place input is this rank's block of the output.
  char* input = coll == "allgather" && v.in_place ? b.out.get() : b.in.get();
  for (size_t i = 0; i < count; ++i) put(input, i, value(r, i));
  call(c, coll, v, b, count, e);
  int64_t wrong = 0;
  if (coll == "allreduce") {
    for (size_t i = 0; i < count; ++i) wrong += get(b.in.get(), i) != sum(i);
  } else if (coll == "reduce_scatter") {
    const char* out = v.in_place ? b.in.get() + r * per_rank * elem_size(e) : b.out.get();
    for (size_t k = 0; k < per_rank; ++k) wrong += get(out, k) != sum(r * per_rank + k);
  } else {  // allgather: rank j's block is its own input at the same offsets
    for (size_t i = 0; i < per_rank * n; ++i)
      wrong += get(b.out.get(), i) != value(static_cast<int>(i / per_rank), i);
  }
  c.allreduce(&wrong, 1, ElemType::kI64, ReduceOp::kSum);
  return wrong;
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
      std::vector<Variant> use;
      for (Algorithm a : algos) {
        try {
          c.choose(op, bytes, a);
        } catch (const InvalidArgument&) {  // not available for this collective/backend
          continue;
        }
        if (op != OpKind::kAllreduce) use.push_back({a, false});  // allreduce works in place
        use.push_back({a, true});
      }
      Buffers b{std::unique_ptr<char[]>(new char[bytes]()),
                std::unique_ptr<char[]>(new char[bytes]())};
      const int reps = o.repeats > 0 ? o.repeats : default_repeats(bytes);
      std::vector<std::vector<double>> t(use.size(), std::vector<double>(reps));
      for (const Variant& v : use) call(c, coll, v, b, count, e);  // warm-up: page faults, scratch
      for (int rep = 0; rep < reps; ++rep)
        for (size_t k = 0; k < use.size(); ++k) {
          c.barrier();
          double t0 = now_seconds();
          call(c, coll, use[k], b, count, e);
          t[k][rep] = now_seconds() - t0;
        }
      for (size_t k = 0; k < use.size(); ++k) {
        Point p;
        p.coll = coll;
        p.algorithm = use[k].algorithm;
        p.in_place = use[k].in_place;
        p.resolved = c.choose(op, bytes, use[k].algorithm);
        p.bytes = bytes;
        p.count = count;
        c.allreduce(t[k].data(), t[k].size(), ElemType::kF64, ReduceOp::kMax);
        p.median_s = median(t[k]);
        p.factor = op == OpKind::kAllreduce ? 2.0 * (n - 1) / n : 1.0 * (n - 1) / n;
        p.wrong = count_wrong(c, coll, use[k], b, count, e);
        points.push_back(p);
      }
    }
  }
  return points;
}

// nccl-tests' names of the element types.
const char* type_name(ElemType e) {
  constexpr const char* kNames[] = {"float", "double", "half", "bfloat16",
                                    "int32", "int64",  "uint8"};
  return kNames[static_cast<size_t>(e)];
}

std::string columns(const Point* p) {
  if (!p) return str(std::string(31, ' '), "n/a");
  const double algbw = p->bytes / p->median_s / 1e9;
  char buf[96];
  std::snprintf(buf, sizeof buf, " %10.1f %7.3f %7.3f %6ld", p->median_s * 1e6, algbw,
                algbw * p->factor, long(p->wrong));
  return buf;
}

void print_block_header(const Point& p) {
  std::printf("#\n# %s, algorithm %s%s\n", p.coll.c_str(), algorithm_name(p.algorithm),
              p.coll == "allreduce" ? " (tessel's allreduce works in place only)" : "");
  std::printf("# %10s %12s %9s %6s %5s %33s %35s\n", "", "", "", "", "", "out-of-place",
              "in-place");
  std::printf("# %10s %12s %9s %6s %5s %10s %7s %7s %6s %10s %7s %7s %6s%s\n", "size", "count",
              "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
              "#wrong", p.algorithm == Algorithm::kAuto ? " chosen" : "");
  std::printf("# %10s %12s %9s %6s %5s %10s %7s %7s %6s %10s %7s %7s\n", "(B)", "(elements)", "",
              "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)");
}

// The nccl-tests layout: per collective and algorithm a block of rows, one per size, with the
// out-of-place and in-place time, algorithm bandwidth, bus bandwidth and wrong elements (and,
// for auto, the algorithm it chose at that size).
void print(const CommBenchOptions& o, int n, double memcpy_bw, const std::vector<Point>& pts) {
  std::printf("# comm bench: backend %s, %d ranks, %s, %u cores%s%s\n", o.backend.c_str(), n,
              elem_name(o.elem), std::max(1u, std::thread::hardware_concurrency()),
              o.backend == "mpi" ? ", " : "", o.backend == "mpi" ? mpi_thread_level() : "");
  std::printf(
      "# memcpy (1 thread, same run): %.2f GB/s; time: median over repeats of the "
      "slowest rank\n",
      memcpy_bw / 1e9);
  // Blocks in the order their collective and algorithm first appear; rows by size.
  std::vector<std::pair<std::string, Algorithm>> blocks;
  for (const Point& p : pts)
    if (std::find(blocks.begin(), blocks.end(), std::pair(p.coll, p.algorithm)) == blocks.end())
      blocks.emplace_back(p.coll, p.algorithm);
  for (const auto& [coll, algorithm] : blocks) {
    bool header = false;
    for (const Point& p : pts) {
      if (p.coll != coll || p.algorithm != algorithm || !p.in_place) continue;
      if (!header) print_block_header(p), header = true;
      const Point* oop = nullptr;  // out of place at the same size, if measured
      for (const Point& q : pts)
        if (q.coll == coll && q.algorithm == algorithm && !q.in_place && q.bytes == p.bytes)
          oop = &q;
      std::printf(
          "  %10zu %12zu %9s %6s %5d%s%s%s\n", p.bytes, p.count, type_name(o.elem),
          p.coll == "allgather" ? "none" : "sum", -1, columns(oop).c_str(), columns(&p).c_str(),
          algorithm == Algorithm::kAuto ? str(" ", algorithm_name(p.resolved)).c_str() : "");
    }
  }
  int64_t wrong = 0;
  double busbw = 0;
  for (const Point& p : pts) {
    wrong += p.wrong;
    busbw += p.bytes / p.median_s / 1e9 * p.factor / static_cast<double>(pts.size());
  }
  std::printf("#\n# wrong elements : %ld %s\n# avg bus bandwidth : %.3f GB/s\n", long(wrong),
              wrong == 0 ? "OK" : "FAILED", busbw);
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
      << "\", \"in_place\": " << (p.in_place ? "true" : "false") << ", \"bytes\": " << p.bytes
      << ", \"count\": " << p.count << ", \"median_us\": " << p.median_s * 1e6
      << ", \"algbw_GBps\": " << algbw << ", \"busbw_GBps\": " << algbw * p.factor
      << ", \"wrong\": " << p.wrong << ", \"ok\": " << (p.wrong == 0 ? "true" : "false") << "}";
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
      return std::all_of(points.begin(), points.end(), [](const Point& p) { return p.wrong == 0; })
                 ? 0
                 : 1;
  }
  print(o, n, memcpy_bw, points);
  if (!o.json_path.empty()) write_json(o, n, memcpy_bw, points);
  return std::all_of(points.begin(), points.end(), [](const Point& p) { return p.wrong == 0; }) ? 0
                                                                                                : 1;
}

}  // namespace tessel::comm
