#include "tessel/core/trace.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

#include "tessel/core/clock.h"

namespace tessel {

namespace {

thread_local Tracer* t_tracer = nullptr;
thread_local const char* t_thread_name = nullptr;
// The row this thread got from the tracer it last recorded into.
thread_local uint64_t t_row_owner = 0;
thread_local int t_row = -1;

std::atomic<uint64_t> g_next_tracer_id{1};

// The shortest text that reads back as v (std::to_chars: several times faster than printf).
void append_number(std::string& out, double v) {
  char buf[32];
  out.append(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}

// Microseconds with nanosecond resolution: enough for spans of a few microseconds.
std::string micros(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", seconds * 1e6);
  return buf;
}

}  // namespace

std::string json_escape(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Keys are literals of plain characters (trace.h): quoted, not escaped.
void TraceArgs::key(const char* k) {
  if (body_.empty())
    body_.reserve(128);  // one allocation for the usual few numbers
  else
    body_ += ',';
  body_ += '"';
  body_ += k;
  body_ += "\":";
}

TraceArgs& TraceArgs::num(const char* k, double value) {
  key(k);
  append_number(body_, value);
  return *this;
}

TraceArgs& TraceArgs::text(const char* k, std::string_view value) {
  key(k);
  body_ += json_escape(value);
  return *this;
}

TraceArgs& TraceArgs::json(const char* k, std::string_view json_value) {
  key(k);
  body_ += json_value;
  return *this;
}

Tracer::Tracer() : id_(g_next_tracer_id.fetch_add(1)) {}

int Tracer::tid_locked() {
  if (t_row_owner == id_) return t_row;
  auto [it, fresh] = tids_.try_emplace(std::this_thread::get_id(), static_cast<int>(tids_.size()));
  if (fresh) thread_names_.push_back(t_thread_name ? t_thread_name : "compute");
  t_row_owner = id_;
  t_row = it->second;
  return t_row;
}

void Tracer::add(char ph, const char* cat, double ts, double dur, std::string_view name,
                 std::string_view args) {
  const size_t size = name.size() + args.size();
  std::lock_guard<std::mutex> lock(mu_);
  if (text_.empty() || text_.back().size() + size > text_.back().capacity()) {
    text_.emplace_back();
    text_.back().reserve(std::max<size_t>(size, 64 << 10));
  }
  std::string& block = text_.back();
  const char* text = block.data() + block.size();  // stays: the block never grows past capacity
  block.append(name).append(args);
  events_.push_back({ph, tid_locked(), ts, dur, cat, text, static_cast<uint32_t>(name.size()),
                     static_cast<uint32_t>(args.size())});
}

void Tracer::span(std::string_view name, const char* cat, double start, double end,
                  TraceArgs args) {
  add('X', cat, start, end - start, name, args.body());
}

void Tracer::instant(std::string_view name, const char* cat, double at, TraceArgs args) {
  add('i', cat, at, 0, name, args.body());
}

void Tracer::counter(std::string_view name, double at, TraceArgs series) {
  add('C', "memory", at, 0, name, series.body());
}

size_t Tracer::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

std::string Tracer::render(int pid, double origin) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string p = std::to_string(pid);
  std::string out;
  auto sep = [&] {
    if (!out.empty()) out += ",\n";
  };
  for (size_t t = 0; t < thread_names_.size(); ++t) {
    sep();
    out += "{\"ph\":\"M\",\"pid\":" + p + ",\"tid\":" + std::to_string(t) +
           ",\"name\":\"thread_name\",\"args\":{\"name\":" + json_escape(thread_names_[t]) + "}}";
  }
  for (const Event& e : events_) {
    sep();
    out += "{\"ph\":\"";
    out += e.ph;
    out += "\",\"pid\":" + p + ",\"tid\":" + std::to_string(e.tid) +
           ",\"ts\":" + micros(e.ts - origin) + ",\"name\":" + json_escape({e.text, e.name_size}) +
           ",\"cat\":\"" + e.cat + "\"";
    if (e.ph == 'X') out += ",\"dur\":" + micros(e.dur);
    if (e.ph == 'i') out += ",\"s\":\"t\"";
    if (e.args_size > 0) out.append(",\"args\":{").append(e.text + e.name_size, e.args_size) += '}';
    out += "}";
  }
  return out;
}

Tracer* active_tracer() { return t_tracer && t_tracer->recording() ? t_tracer : nullptr; }
Tracer* scoped_tracer() { return t_tracer; }

TraceScope::TraceScope(Tracer* tracer) : saved_(t_tracer) { t_tracer = tracer; }
TraceScope::~TraceScope() { t_tracer = saved_; }

void set_trace_thread_name(const char* name) { t_thread_name = name; }

TraceSpan::TraceSpan(std::string_view name, const char* cat) : tracer_(active_tracer()), cat_(cat) {
  if (!tracer_) return;
  name_.assign(name);
  start_ = now_seconds();
}

TraceSpan::~TraceSpan() {
  if (tracer_) tracer_->span(name_, cat_, start_, now_seconds(), std::move(args_));
}

}  // namespace tessel
