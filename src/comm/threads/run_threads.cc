#include <atomic>
#include <exception>
#include <thread>

#include "tessel/comm/threads.h"
#include "tessel/core/error.h"

namespace tessel::comm {

std::vector<Communicator> make_thread_world(int world_size, const CommOptions& options) {
  std::vector<Communicator> out;
  for (auto& t : make_thread_transports(world_size, options))
    out.emplace_back(std::move(t), options);
  return out;
}

void run_threads(int world_size, const std::function<void(Communicator&)>& fn,
                 const CommOptions& options) {
  std::vector<Communicator> comms = make_thread_world(world_size, options);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<int> order(world_size, -1);
  std::vector<char> consequence(world_size, 0);
  std::atomic<int> failures{0};

  auto body = [&](int r) {
    try {
      fn(comms[r]);
    } catch (const std::exception& e) {
      errors[r] = std::current_exception();
      // A CommError raised after the group was aborted is a consequence, not the cause.
      consequence[r] = dynamic_cast<const CommError*>(&e) != nullptr;
      order[r] = failures.fetch_add(1);
      comms[r].abort(str("comm: rank ", r, " failed: ", e.what()));
    } catch (...) {
      errors[r] = std::current_exception();
      order[r] = failures.fetch_add(1);
      comms[r].abort(str("comm: rank ", r, " failed with a non-standard exception"));
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(world_size - 1);
  for (int r = 1; r < world_size; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();

  // Rethrow the root cause: the earliest error that is not a CommError, else the earliest.
  int pick = -1;
  for (int pass = 0; pass < 2 && pick < 0; ++pass)
    for (int r = 0; r < world_size; ++r)
      if (errors[r] && (pass == 1 || !consequence[r]) && (pick < 0 || order[r] < order[pick]))
        pick = r;
  if (pick >= 0) std::rethrow_exception(errors[pick]);
}

}  // namespace tessel::comm
