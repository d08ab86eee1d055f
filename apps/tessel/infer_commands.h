// The inference subcommands of the tessel command line, each in its own file: `predict`
// (predict.cc), `serve` (serve.cc), the tokenizer tools (tokenizer.cc) and the checkpoint
// tools (ckpt.cc). add_* declares the
// subcommand and its options; run() runs it once parsed and returns the exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

struct InferCommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

InferCommand add_predict(CLI::App& app);
// `tessel predict ...` starts itself again with glibc told to back its heap with transparent
// huge pages (the glibc.malloc.hugetlb tunable, read only at start-up; kernels in `madvise` mode
// give them only on request). A predict job is short and much of its time is first touches of
// fresh activation memory, one page fault per 4 KiB, each an exit to the host on a VM:
// fashion_cnn over 10,000 images on 2 workers took 12.5k faults and ran 37k rows/s, with huge
// pages 1.3-1.5k faults and 45k rows/s. Call first in main(); returns when nothing is to do
// or the exec failed.
void restart_predict_on_huge_pages(char** argv);
InferCommand add_serve(CLI::App& app);

// `tessel tokenizer train` and `tessel tokenize` (tokenizer.cc).
struct TokenizerCommands {
  InferCommand train, tokenize;
};
TokenizerCommands add_tokenizer_commands(CLI::App& app);

// `tessel ckpt export` and `tessel ckpt import` (ckpt.cc).
struct CkptCommands {
  InferCommand exp, imp;
};
CkptCommands add_ckpt_commands(CLI::App& app);
