// The Tracer (spans only while recording, rows per thread, nesting scopes, step windows, valid
// Trace Event Format JSON).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "tessel/core/clock.h"
#include "tessel/core/trace.h"

namespace tessel {
namespace {

nlohmann::json events_of(const Tracer& t, int pid = 3) {
  std::string text(1, '[');
  text += t.render(pid, 0.0);
  text += ']';
  return nlohmann::json::parse(text);
}

TEST(Trace, RecordsOnlyWhileRecordingInScope) {
  Tracer t;
  { TraceSpan s("outside any scope", "test"); }
  TraceScope scope(&t);
  { TraceSpan s("not recording", "test"); }
  EXPECT_EQ(active_tracer(), nullptr);
  EXPECT_EQ(scoped_tracer(), &t);
  t.set_recording(true);
  EXPECT_EQ(active_tracer(), &t);
  {
    TraceSpan s("recorded", "test");
    ASSERT_NE(s.args(), nullptr);
    s.args()->num("bytes", 64).text("what", "a \"quoted\" name");
  }
  ASSERT_EQ(t.size(), 1u);
  const nlohmann::json ev = events_of(t);
  ASSERT_EQ(ev.size(), 2u);  // thread name + the span
  EXPECT_EQ(ev[0]["ph"], "M");
  EXPECT_EQ(ev[0]["args"]["name"], "compute");
  EXPECT_EQ(ev[1]["ph"], "X");
  EXPECT_EQ(ev[1]["pid"], 3);
  EXPECT_EQ(ev[1]["name"], "recorded");
  EXPECT_EQ(ev[1]["args"]["bytes"], 64);
  EXPECT_EQ(ev[1]["args"]["what"], "a \"quoted\" name");
  EXPECT_GE(ev[1]["dur"].get<double>(), 0.0);
}

TEST(Trace, ScopesNestAndRestore) {
  Tracer a, b;
  a.set_recording(true);
  b.set_recording(true);
  {
    TraceScope sa(&a);
    {
      TraceScope sb(&b);
      EXPECT_EQ(active_tracer(), &b);
      TraceScope none(nullptr);
      EXPECT_EQ(active_tracer(), nullptr);
    }
    EXPECT_EQ(active_tracer(), &a);
  }
  EXPECT_EQ(active_tracer(), nullptr);
}

TEST(Trace, StepWindow) {
  Tracer t;
  t.set_window(3, 5);
  const bool expect[] = {false, false, false, true, true, false, false};
  for (int step = 0; step < 7; ++step) {
    t.at_step(step);
    EXPECT_EQ(t.recording(), expect[step]) << "step " << step;
  }
}

TEST(Trace, ThreadsGetNamedRows) {
  Tracer t;
  t.set_recording(true);
  TraceScope scope(&t);
  t.span("main", "test", 1.0, 2.0);
  std::thread other([&] {
    set_trace_thread_name("prefetch");
    TraceScope s(&t);
    t.span("loaded", "data", 1.5, 1.7);
    t.instant("marker", "data", 1.8);
    TraceArgs mib;
    mib.num("parameters", 1.5).num("activations", 2);
    t.counter("memory (MiB)", 1.9, mib);
  });
  other.join();
  const nlohmann::json ev = events_of(t, 0);
  std::map<int, std::string> names;
  for (const auto& e : ev)
    if (e["ph"] == "M") names[e["tid"].get<int>()] = e["args"]["name"];
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0], "compute");
  EXPECT_EQ(names[1], "prefetch");
  int counters = 0, instants = 0;
  for (const auto& e : ev) {
    if (e["ph"] == "X" && e["name"] == "loaded") {
      EXPECT_EQ(e["tid"], 1);
      EXPECT_NEAR(e["ts"].get<double>(), 1.5e6, 1e-3);
      EXPECT_NEAR(e["dur"].get<double>(), 0.2e6, 1e-3);
    }
    counters += e["ph"] == "C";
    instants += e["ph"] == "i";
    if (e["ph"] == "C") {
      EXPECT_EQ(e["args"]["activations"], 2);
    }
  }
  EXPECT_EQ(counters, 1);
  EXPECT_EQ(instants, 1);
}

TEST(Trace, OffCostsNothingMeasurable) {
  // Not a timing test: tracing off records nothing and allocates no names.
  Tracer t;
  TraceScope scope(&t);
  for (int i = 0; i < 1000; ++i) {
    TraceSpan s("never", "test");
    EXPECT_EQ(s.args(), nullptr);
  }
  EXPECT_EQ(t.size(), 0u);
}

}  // namespace
}  // namespace tessel
