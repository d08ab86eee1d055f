// What was built: the release version and the source commit, recorded in every run folder and
// printed by `tessel --version`. The commit is read from git at build time ("unknown" outside a
// git checkout; "+dirty" when the work tree had uncommitted changes).
#pragma once

namespace tessel {

const char* version();  // "0.1.0"
const char* commit();   // e.g. "6428adc" or "6428adc+dirty"

}  // namespace tessel
