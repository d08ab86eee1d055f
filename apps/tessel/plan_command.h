// `tessel plan` (plan.cc): declared like the inference subcommands, a subcommand and the
// function that runs it once parsed.
#pragma once

#include "infer_commands.h"

InferCommand add_plan(CLI::App& app);
