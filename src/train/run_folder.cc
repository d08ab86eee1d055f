#include "tessel/train/run_folder.h"

#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "tessel/core/version.h"
#include "tessel/ops/isa.h"

namespace tessel::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A checkpoints/ entry that tessel writes: "latest" and step folders, committed or temporary
// ("step-000123", "step-000123.tmp-4711", "latest.tmp-4711").
bool is_checkpoint_entry(const std::string& name) {
  return name == "latest" || name.rfind("latest.tmp-", 0) == 0 || name.rfind("step-", 0) == 0;
}

// Why a fresh run may not start in run_dir ("" when it may).
std::string refusal(const std::string& run_dir) {
  const std::vector<std::string> found = run_files_in(run_dir);
  if (found.empty()) return "";
  std::string list;
  for (const std::string& f : found) list += (list.empty() ? "" : ", ") + f;
  return str("run: ", run_dir, " already holds a run (", list, "); continue it with --resume ",
             run_dir,
             ", start over with --overwrite (removes only the files tessel wrote), or "
             "pick another --run-dir");
}

void clear_run(const std::string& run_dir) {
  std::error_code ec;
  for (const std::string& f : kRunFiles) fs::remove_all(fs::path(run_dir) / f, ec);
  const fs::path ckpts = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(ckpts, ec)) return;
  for (const fs::directory_entry& e : fs::directory_iterator(ckpts, ec))
    if (is_checkpoint_entry(e.path().filename().string())) fs::remove_all(e.path(), ec);
  if (fs::is_empty(ckpts, ec)) fs::remove(ckpts, ec);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Appends this start to run.json's "starts" (a new list unless resuming).
void record_start(const std::string& run_dir, RunStart start, const RunRecord& r, int world) {
  const fs::path path = fs::path(run_dir) / "run.json";
  json doc = {{"starts", json::array()}};
  if (start == RunStart::kResume && fs::exists(path)) {
    std::ifstream in(path);
    json old = json::parse(in, nullptr, false);
    if (old.is_object() && old.contains("starts") && old["starts"].is_array())
      doc = old;
    else
      log_warn("run: ", path.string(), " is not a run record; starting a new one");
  }
  json s = {{"time", utc_now()},
            {"how", start == RunStart::kFresh    ? "fresh"
                    : start == RunStart::kResume ? "resume"
                                                 : "overwrite"},
            {"command", r.command},
            {"tessel_version", version()},
            {"commit", commit()},
            {"host", host_name()},
            {"isa", ops::isa_description()},
            {"world_size", world},
            {"layout", r.layout}};
  if (!r.resumed_from.empty()) s["resumed_from"] = r.resumed_from;
  if (!r.layout_auto.is_null()) s["layout_auto"] = r.layout_auto;
  doc["starts"].push_back(s);
  ckpt::write_file_atomic(path.string(), doc.dump(2) + "\n");
}

}  // namespace

void record_resumed_from(const std::string& run_dir, const std::string& dir) {
  const fs::path path = fs::path(run_dir) / "run.json";
  std::ifstream in(path);
  json doc = json::parse(in, nullptr, false);
  if (!doc.is_object() || !doc.contains("starts") || !doc["starts"].is_array() ||
      doc["starts"].empty())
    return;
  json& last = doc["starts"].back();
  const std::string named = last.value("resumed_from", "");
  std::error_code ec;
  if (named.empty() || fs::equivalent(named, dir, ec)) return;
  last["passed_over"] = named;
  last["resumed_from"] = dir;
  ckpt::write_file_atomic(path.string(), doc.dump(2) + "\n");
}

std::string host_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

std::vector<std::string> run_files_in(const std::string& run_dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const std::string& f : kRunFiles)
    if (fs::exists(fs::path(run_dir) / f, ec)) found.push_back(f);
  const fs::path ckpts = fs::path(run_dir) / "checkpoints";
  if (fs::is_directory(ckpts, ec))
    for (const fs::directory_entry& e : fs::directory_iterator(ckpts, ec))
      if (is_checkpoint_entry(e.path().filename().string())) {
        found.push_back("checkpoints/");
        break;
      }
  return found;
}

void prepare_run_folder(comm::Communicator& world, const std::string& run_dir, RunStart start,
                        const RunRecord& record) {
  // Rank 0 decides and tells every rank, so all of them fail alike, before anyone writes.
  std::string problem = world.rank() == 0 && start == RunStart::kFresh ? refusal(run_dir) : "";
  int64_t size = static_cast<int64_t>(problem.size());
  world.broadcast(&size, 1, comm::ElemType::kI64, 0);
  problem.resize(static_cast<size_t>(size));
  if (size > 0) world.broadcast(problem.data(), problem.size(), comm::ElemType::kU8, 0);
  if (!problem.empty()) throw InvalidArgument(problem);
  if (world.rank() == 0) {
    if (start == RunStart::kOverwrite) clear_run(run_dir);
    fs::create_directories(run_dir);
    record_start(run_dir, start, record, world.size());
  }
  world.barrier();  // the folder is ready before any rank writes into it
}

}  // namespace tessel::train
