# tessel: top-level entry points. `make demo` and `make test` work on a fresh Debian 12 machine.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
SANITIZE ?=
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: setup build test test-multihost demo bench clean sanitize-test tsan-test

setup:
	@scripts/setup.sh

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DTESSEL_SANITIZE=$(SANITIZE) $(CMAKE_FLAGS)

build: setup $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -LE slow

# Opt-in: training and collectives across network-namespace "hosts" over TCP (needs root; skips
# cleanly, saying why, where namespaces cannot be made). See docs/multihost_namespaces.md.
test-multihost: build
	tests/parallel/multihost_netns_test.sh $(BUILD_DIR)/apps/tessel/tessel $(CURDIR) || [ $$? -eq 77 ]

demo: build
	$(BUILD_DIR)/apps/tessel/tessel train examples/fashion_mlp.toml --workers 4 --run-dir runs/demo

bench: build
	$(BUILD_DIR)/bench/train_throughput

# The suite (ctest -LE slow) under AddressSanitizer + UndefinedBehaviorSanitizer in build-asan
# (-O1, asserts on; any finding fails its test). OpenMPI's own leaks at exit are suppressed, and
# only those: tests/sanitizers/lsan.supp says why and why the other settings are needed.
SANITIZER_ENV = LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizers/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0 \
                OMPI_MCA_mca_base_component_disable_dlclose=1 \
                PMIX_MCA_mca_base_component_disable_dlclose=1 UBSAN_OPTIONS=print_stacktrace=1
sanitize-test:
	$(MAKE) build BUILD_DIR=build-asan BUILD_TYPE=Debug SANITIZE=address,undefined
	cd build-asan && $(SANITIZER_ENV) ctest --output-on-failure -j $(JOBS) -LE slow

# The threaded tests under ThreadSanitizer in build-tsan: collectives, the parallel layouts,
# predict's chunk queue and serve's batcher, and restarts from in-memory snapshots (fault_test
# runs the tessel binary, built with the same sanitizer).
TSAN_TESTS = comm/comm_test comm/comm_failure_test comm/comm_conformance_test comm/nccl_test \
             parallel/dp_test parallel/zero_test parallel/pipeline_test parallel/ps_test \
             infer/predict_parts_test cli/fault_test
tsan-test: setup
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTESSEL_SANITIZE=thread $(CMAKE_FLAGS)
	cmake --build build-tsan -j $(JOBS) --target tessel $(notdir $(TSAN_TESTS))
	for t in $(TSAN_TESTS); do TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/$$t || exit 1; done

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan
