// The whole decision table walked (label slow): every combination of the grid.
#define TESSEL_FULL_SWEEP 1
#include "composition_test.cc"
