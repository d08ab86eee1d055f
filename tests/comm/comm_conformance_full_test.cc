// The full conformance sweep (label slow): every algorithm x world size x count x dtype x op.
#define TESSEL_FULL_SWEEP 1
#include "comm_conformance_test.cc"
