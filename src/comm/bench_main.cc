// tessel_comm_bench: a standalone driver of run_comm_bench() for use under mpirun, with the
// options of `tessel bench comm`:
//   tessel_comm_bench [--backend threads|mpi] [--workers N] [--algorithm a,b,..]
//                     [--sizes 4KiB..64MiB] [--collective allreduce,..] [--dtype f32]
//                     [--repeats N] [--segment BYTES] [--in-flight N] [--json FILE]
#include <cstdio>
#include <string>

#include "tessel/comm/bench.h"
#include "tessel/core/error.h"

int main(int argc, char** argv) {
  using namespace tessel::comm;
  CommBenchOptions o;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc)
          throw tessel::InvalidArgument(tessel::str("tessel_comm_bench: ", arg, " needs a value"));
        return argv[++i];
      };
      if (arg == "--backend")
        o.backend = value();
      else if (arg == "--workers")
        o.workers = std::stoi(value());
      else if (arg == "--algorithm")
        o.algorithms = parse_algorithms(value());
      else if (arg == "--sizes")
        o.sizes = parse_size_list(value());
      else if (arg == "--collective") {
        o.collectives.clear();
        std::string list = value(), item;
        for (char ch : list + ",")
          if (ch == ',') {
            if (!item.empty()) o.collectives.push_back(item);
            item.clear();
          } else {
            item += ch;
          }
      } else if (arg == "--dtype")
        o.elem = elem_type_from_name(value());
      else if (arg == "--repeats")
        o.repeats = std::stoi(value());
      else if (arg == "--segment")
        o.segment_bytes = parse_bytes(value());
      else if (arg == "--in-flight")
        o.in_flight = std::stoi(value());
      else if (arg == "--json")
        o.json_path = value();
      else
        throw tessel::InvalidArgument(tessel::str("tessel_comm_bench: unknown option ", arg,
                                                  "; see the comment at the top of bench_main.cc"));
    }
    return run_comm_bench(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessel_comm_bench: error: %s\n", e.what());
    return 1;
  }
}
