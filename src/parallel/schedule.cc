// Pipeline schedules: in which order each stage runs its forward and backward tasks, and the
// check that the messages of a schedule pair up.
#include "tessel/parallel/schedule.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "tessel/core/error.h"

namespace tessel::parallel {

namespace {

// Forwards before the interleaved schedule's first backward on stage s (v chunks per stage).
int interleaved_warmup(int stages, int micro, int v, int s) {
  const int total = micro * v;
  return micro == stages ? total : std::min(total, 2 * (stages - s - 1) + (v - 1) * stages);
}

// Megatron-LM's interleaved 1F1B. Stage s holds chunks s, s + P, ..., s + (v - 1) P. Its
// forwards run through the micro-batches in groups of P (m a multiple of P, or one group of
// m < P; a short last group can deadlock): the group on the stage's first chunk, then on its
// second, ...; its backwards run the same table with the chunks in reverse. A stage warms up
// with 2 (P - s - 1) + (v - 1) P forwards (every forward when m = P, as Megatron does), then
// runs one forward and one backward in turn, then the remaining backwards.
std::vector<std::vector<Task>> interleaved_schedule(const Partition& part, int stages, int micro) {
  const int C = static_cast<int>(part.chunks());
  bool round = C % stages == 0 && C / stages >= 2;
  for (int c = 0; c < C; ++c) round = round && part.stage[c] == c % stages;
  if (!round)
    throw InvalidArgument(str("pipeline: the interleaved schedule needs chunk c on stage c mod ",
                              stages, " and at least 2 chunks per stage, got ", C,
                              " chunks; set pp.virtual_stages >= 2 with pp.partition = balanced "
                              "or uniform"));
  if (micro > stages && micro % stages != 0)
    throw InvalidArgument(str("config: pp.schedule = interleaved runs the micro-batches in groups ",
                              "of pp.stages = ", stages, ", so pp.microbatches must be at most ",
                              stages, " or a multiple of it, got ", micro, "; use ",
                              micro - micro % stages, " or ", micro + stages - micro % stages));
  const int v = C / stages, total = micro * v;
  std::vector<std::pair<int, int>> table;  // (micro-batch, local chunk) in forward order
  for (int g = 0; g < micro; g += stages)
    for (int k = 0; k < v; ++k)
      for (int j = g; j < std::min(g + stages, micro); ++j) table.push_back({j, k});
  std::vector<std::vector<Task>> order(stages);
  for (int s = 0; s < stages; ++s) {
    const int warm = interleaved_warmup(stages, micro, v, s);
    auto forward = [&](int k) {
      order[s].push_back({TaskOp::kForward, table[k].second * stages + s, table[k].first});
    };
    auto backward = [&](int k) {
      order[s].push_back(
          {TaskOp::kBackward, (v - 1 - table[k].second) * stages + s, table[k].first});
    };
    for (int k = 0; k < warm; ++k) forward(k);
    for (int k = 0; k < total - warm; ++k) forward(warm + k), backward(k);
    for (int k = total - warm; k < total; ++k) backward(k);
  }
  return order;
}

// ZB-H1 as PyTorch's ZB1P builds it: 1f1b's warm-up, then F, B and the oldest pending W, the
// Ws held back by s on stage s so that every stage has min(m, P) micro-batches in flight.
std::vector<std::vector<Task>> zb_h1_schedule(const Partition& part, int stages, int micro) {
  bool one = static_cast<int>(part.chunks()) == stages;
  for (int c = 0; one && c < stages; ++c) one = part.stage[c] == c;
  if (!one)
    throw InvalidArgument(str("pipeline: pp.schedule = zb-h1 runs one chunk per stage (chunk s on ",
                              "stage s), got ", part.chunks(), " chunks on ", stages,
                              " stages; use pp.partition = balanced or uniform, or "
                              "pp.schedule = interleaved for several chunks per stage"));
  std::vector<std::vector<Task>> order(stages);
  for (int s = 0; s < stages; ++s) {
    int f = 0, b = 0, w = 0;
    for (; f < std::min(micro, stages - 1 - s); ++f) order[s].push_back({TaskOp::kForward, s, f});
    for (int k = 0; k < micro; ++k) {
      if (f < micro) order[s].push_back({TaskOp::kForward, s, f++});
      order[s].push_back({TaskOp::kBackward, s, b++});
      if (k >= s) order[s].push_back({TaskOp::kWeight, s, w++});
    }
    while (w < micro) order[s].push_back({TaskOp::kWeight, s, w++});
  }
  return order;
}

// A list scheduler run in simulated time: at each moment every idle stage picks one ready task
// by the schedule's rule (gpipe or 1f1b; without backward: forwards only). The simulated run is
// a valid execution, so ordering each stage's tasks by their simulated start gives orders
// consistent with one global order.
std::vector<std::vector<Task>> simulate(const Partition& part, int stages, int micro,
                                        PpSchedule kind, bool backward) {
  TESSEL_CHECK(micro >= 1 && stages >= 1, "pipeline: schedule of ", micro, " micro-batches");
  const int C = static_cast<int>(part.chunks());
  const bool one_f_one_b = backward && kind == PpSchedule::k1f1b;
  const double inf = std::numeric_limits<double>::infinity();
  // done_f[c][j], done_b[c][j]: simulated finish times (inf: not yet).
  std::vector<std::vector<double>> done_f(C, std::vector<double>(micro, inf)), done_b = done_f;
  std::vector<std::vector<bool>> started_f(C, std::vector<bool>(micro, false));
  std::vector<std::vector<bool>> started_b = started_f;
  std::vector<double> busy(stages, 0);
  std::vector<int> forwards_left(stages, 0), first_chunk(stages, C);
  for (int c = 0; c < C; ++c) {
    forwards_left[part.stage[c]] += micro;
    first_chunk[part.stage[c]] = std::min(first_chunk[part.stage[c]], c);
  }
  // Micro-batches in flight per stage: forwarded on some chunk, not yet fully backward.
  std::vector<std::vector<int>> open(stages, std::vector<int>(micro, 0));
  std::vector<int> inflight(stages, 0);
  std::vector<std::vector<Task>> order(stages);
  const size_t total = static_cast<size_t>(C) * micro * (backward ? 2 : 1);
  size_t scheduled = 0;
  double now = 0;
  while (scheduled < total) {
    for (int s = 0; s < stages; ++s) {
      if (busy[s] > now) continue;
      // Ready tasks of stage s: (ready time, micro, chunk) picks FIFO, then the lowest micro.
      std::tuple<double, int, int> best_f{inf, 0, 0}, best_b{inf, 0, 0};
      const int cap = std::min(micro, C - first_chunk[s]);
      for (int c = 0; c < C; ++c) {
        if (part.stage[c] != s) continue;
        for (int j = 0; j < micro; ++j) {
          if (!started_f[c][j]) {
            double ready = c == 0 ? 0 : done_f[c - 1][j];
            bool allowed = !one_f_one_b || open[s][j] > 0 || inflight[s] < cap;
            if (ready <= now && allowed) best_f = std::min(best_f, {ready, j, c});
          } else if (backward && !started_b[c][j]) {
            double ready = c + 1 == C ? done_f[c][j] : done_b[c + 1][j];
            ready = std::max(ready, done_f[c][j]);
            if (ready <= now) best_b = std::min(best_b, {ready, j, -c});
          }
        }
      }
      bool pick_b = std::get<0>(best_b) < inf;
      if (kind == PpSchedule::kGpipe && forwards_left[s] > 0) pick_b = false;
      if (!pick_b && std::get<0>(best_f) == inf) continue;
      if (pick_b) {
        const int j = std::get<1>(best_b), c = -std::get<2>(best_b);
        started_b[c][j] = true;
        busy[s] = done_b[c][j] = now + 2;
        order[s].push_back({TaskOp::kBackward, c, j});
        if (--open[s][j] == 0) --inflight[s];
      } else {
        const int j = std::get<1>(best_f), c = std::get<2>(best_f);
        started_f[c][j] = true;
        busy[s] = done_f[c][j] = now + 1;
        order[s].push_back({TaskOp::kForward, c, j});
        --forwards_left[s];
        if (backward && open[s][j]++ == 0) ++inflight[s];
      }
      ++scheduled;
    }
    // Advance to the next finish time.
    double next = inf;
    for (int s = 0; s < stages; ++s)
      if (busy[s] > now) next = std::min(next, busy[s]);
    TESSEL_CHECK(next < inf || scheduled == total, "pipeline: the ",
                 backward ? name_of(kind) : "forward", " schedule simulation stalled after ",
                 scheduled, " of ", total, " tasks");
    if (next < inf) now = next;
  }
  return order;
}

}  // namespace

std::vector<std::vector<Task>> make_schedule(const Partition& part, int stages, int micro,
                                             PpSchedule kind) {
  if (kind == PpSchedule::kInterleaved) return interleaved_schedule(part, stages, micro);
  if (kind == PpSchedule::kZbH1) return zb_h1_schedule(part, stages, micro);
  return simulate(part, stages, micro, kind, true);
}

std::vector<std::vector<Task>> forward_schedule(const Partition& part, int stages, int micro) {
  return simulate(part, stages, micro, PpSchedule::kGpipe, false);
}

std::vector<int> inflight_bound(const Partition& part, int stages, int micro, PpSchedule kind) {
  const int C = static_cast<int>(part.chunks());
  std::vector<int> chunks(stages, 0), first(stages, C), bound(stages, 0);
  for (int c = 0; c < C; ++c) {
    ++chunks[part.stage[c]];
    first[part.stage[c]] = std::min(first[part.stage[c]], c);
  }
  for (int s = 0; s < stages; ++s) switch (kind) {
      case PpSchedule::kGpipe:
        bound[s] = micro * chunks[s];
        break;
      case PpSchedule::k1f1b:
        bound[s] = std::min(micro, C - first[s]) * chunks[s];
        break;
      case PpSchedule::kInterleaved:
        bound[s] = std::min(micro * chunks[s], interleaved_warmup(stages, micro, chunks[s], s) + 1);
        break;
      case PpSchedule::kZbH1:
        bound[s] = std::min(micro, stages);
        break;
    }
  return bound;
}

namespace {

// A message: (kind, boundary or -1, micro); kind 0 activation, 1 gradient, 2 tied gradient.
using Msg = std::tuple<int, int, int>;
using Owners = std::map<Msg, int>;  // the stage that sends (or receives) each message
const char* const kOpNames[] = {"forward", "backward", "weight gradient"};

std::string msg_name(const Msg& m) {
  static const char* kinds[] = {"activation", "activation gradient", "tied-table gradient"};
  return str(kinds[std::get<0>(m)], " of micro-batch ", std::get<2>(m),
             std::get<1>(m) >= 0 ? str(" across chunk boundary ", std::get<1>(m)) : "");
}

// The messages a task receives and sends. With W tasks (split) the tied-table gradient travels
// once, from the head's last W to the embedding's; without, per micro-batch from B to B.
struct Wiring {
  int chunks, tied_from, tied_to, micro;
  bool split;
  struct Io {
    std::vector<Msg> recvs, sends;
  };
  Io io(const Task& t) const {
    Io io;
    const int c = t.chunk, j = t.micro;
    const bool tied = t.op == (split ? TaskOp::kWeight : TaskOp::kBackward) &&
                      (!split || j == micro - 1) && tied_from >= 0;
    if (t.op == TaskOp::kForward) {
      if (c > 0) io.recvs.push_back({0, c - 1, j});
      if (c + 1 < chunks) io.sends.push_back({0, c, j});
    } else if (t.op == TaskOp::kBackward) {
      if (c + 1 < chunks) io.recvs.push_back({1, c, j});
      if (c > 0) io.sends.push_back({1, c - 1, j});
    }
    if (tied && c == tied_to) io.recvs.push_back({2, -1, j});
    if (tied && c == tied_from) io.sends.push_back({2, -1, j});
    return io;
  }
};

// Stage s's tasks: each on a chunk of the stage, once, after the tasks it follows (F before B
// before W), and never more activation sets held than `bound` (0: no bound). Records who
// sends and receives each message into sent_by / recv_by.
void check_stage_tasks(const Partition& part, const std::vector<Task>& order, int s,
                       const Wiring& w, int bound, std::set<std::tuple<int, int, int>>& seen,
                       Owners& sent_by, Owners& recv_by) {
  int held = 0;
  for (const Task& t : order) {
    TESSEL_CHECK(t.chunk >= 0 && t.chunk < w.chunks && part.stage[t.chunk] == s && t.micro >= 0 &&
                     t.micro < w.micro,
                 "pipeline: stage ", s, " schedules chunk ", t.chunk, " micro-batch ", t.micro,
                 " which it does not hold");
    const int op = static_cast<int>(t.op);
    if (!seen.insert({op, t.chunk, t.micro}).second)
      throw Error(str("pipeline: stage ", s, " schedules chunk ", t.chunk, " micro-batch ", t.micro,
                      " twice"));
    if (op > 0 && !seen.count({op - 1, t.chunk, t.micro}))
      throw Error(str("pipeline: stage ", s, " runs the ", kOpNames[op], " of chunk ", t.chunk,
                      " micro-batch ", t.micro, " before its ", kOpNames[op - 1]));
    if (t.op == TaskOp::kForward)
      ++held;
    else if (t.op == (w.split ? TaskOp::kWeight : TaskOp::kBackward))
      --held;
    if (bound > 0 && held > bound)
      throw Error(str("pipeline: stage ", s, " holds ", held, " activation sets after the ",
                      kOpNames[op], " of chunk ", t.chunk, " micro-batch ", t.micro,
                      ", more than the schedule's bound of ", bound));
    const Wiring::Io io = w.io(t);
    for (const Msg& m : io.sends) sent_by[m] = s;
    for (const Msg& m : io.recvs) recv_by[m] = s;
  }
}

// Every message sent is received and the other way round, and the messages of one kind and
// boundary (one link) arrive in the order they are sent.
void check_message_pairs(const std::vector<std::vector<Task>>& schedule, const Wiring& w,
                         const Owners& sent_by, const Owners& recv_by) {
  for (auto& [m, s] : sent_by)
    if (!recv_by.count(m))
      throw Error(
          str("pipeline: stage ", s, " sends the ", msg_name(m), " that no stage receives"));
  for (auto& [m, s] : recv_by)
    if (!sent_by.count(m))
      throw Error(
          str("pipeline: stage ", s, " waits for the ", msg_name(m), " that no stage sends"));
  // Per path (from, to) and link (kind, boundary): the micro-batches in order at each end.
  using Links = std::map<std::pair<int, int>, std::vector<int>>;
  std::map<std::pair<int, int>, Links> sent, received;
  for (size_t s = 0; s < schedule.size(); ++s)
    for (const Task& t : schedule[s]) {
      const Wiring::Io io = w.io(t);
      const int me = static_cast<int>(s);
      for (const Msg& m : io.sends)
        sent[{me, recv_by.at(m)}][{std::get<0>(m), std::get<1>(m)}].push_back(std::get<2>(m));
      for (const Msg& m : io.recvs)
        received[{sent_by.at(m), me}][{std::get<0>(m), std::get<1>(m)}].push_back(std::get<2>(m));
    }
  for (auto& [path, links] : sent)
    if (links != received[path])
      throw Error(str("pipeline: stage ", path.first, " sends to stage ", path.second,
                      " in a different order than stage ", path.second, " receives"));
}

// Runs the schedule with sends that never block and receives that block until their message
// was sent: a stage left waiting is a deadlock.
void check_progress(const std::vector<std::vector<Task>>& schedule, const Wiring& w) {
  const size_t stages = schedule.size();
  std::vector<size_t> next(stages, 0);
  std::set<Msg> arrived;
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t s = 0; s < stages; ++s)
      while (next[s] < schedule[s].size()) {
        const Wiring::Io io = w.io(schedule[s][next[s]]);
        if (!std::all_of(io.recvs.begin(), io.recvs.end(),
                         [&](const Msg& m) { return arrived.count(m) > 0; }))
          break;
        arrived.insert(io.sends.begin(), io.sends.end());
        ++next[s];
        progress = true;
      }
  }
  for (size_t s = 0; s < stages; ++s) {
    if (next[s] == schedule[s].size()) continue;
    const Task& t = schedule[s][next[s]];
    for (const Msg& m : w.io(t).recvs)
      if (!arrived.count(m))
        throw Error(str("pipeline: the schedule deadlocks: stage ", s, " waits for the ",
                        msg_name(m), " before its ", kOpNames[static_cast<int>(t.op)], " of chunk ",
                        t.chunk, ", which is never sent first"));
  }
}

}  // namespace

void check_schedule(const Partition& part, const std::vector<std::vector<Task>>& schedule,
                    int micro, int tied_from, int tied_to, const std::vector<int>& bound) {
  bool split = false, training = false;
  for (const auto& order : schedule)
    for (const Task& t : order) {
      split = split || t.op == TaskOp::kWeight;
      training = training || t.op != TaskOp::kForward;
    }
  const Wiring w{static_cast<int>(part.chunks()), tied_from, tied_to, micro, split};
  std::set<std::tuple<int, int, int>> seen;
  Owners sent_by, recv_by;
  for (size_t s = 0; s < schedule.size(); ++s)
    check_stage_tasks(part, schedule[s], static_cast<int>(s), w, bound.empty() ? 0 : bound[s], seen,
                      sent_by, recv_by);
  check_message_pairs(schedule, w, sent_by, recv_by);
  const size_t tasks = static_cast<size_t>(w.chunks) * micro * (1 + training + split);
  if (seen.size() != tasks)
    throw Error(str("pipeline: the schedule runs ", seen.size(), " tasks, not the ", tasks, " of ",
                    w.chunks, " chunks x ", micro, " micro-batches x ",
                    split      ? "forward, backward and weight gradient"
                    : training ? "forward and backward"
                               : "forward"));
  check_progress(schedule, w);
}

double bubble_model(PpSchedule kind, int stages, int micro, int virtual_stages) {
  const double p = stages, m = micro, v = kind == PpSchedule::kInterleaved ? virtual_stages : 1;
  if (kind == PpSchedule::kZbH1)
    return m < p ? (2 * p - m - 1) / (2 * p + 2 * m - 1) : (p - 1) / (3 * m + p - 1);
  // Fewer micro-batches than stages: one pass through P v chunks of 1/v the time each.
  if (m < p) return (v * (p - m) + m - 1) / (v * p + m - 1);
  return (p - 1) / (v * m + p - 1);
}

std::string order_str(const Partition& part, int stages, const std::vector<Task>& order) {
  std::string out;
  for (const Task& t : order) {
    static const char* letters[] = {"F", "B", "W"};
    out += str(out.empty() ? "" : " ", letters[static_cast<int>(t.op)], t.micro);
    if (static_cast<int>(part.chunks()) > stages) out += str("/", t.chunk);
  }
  return out;
}

}  // namespace tessel::parallel
