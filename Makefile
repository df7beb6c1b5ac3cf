# tandem — the two commands a newcomer needs are `make run` and `make test` (see README.md).
# Everything else here is a convenience around CMake.
JOBS        ?= $(shell nproc)
BUILD       ?= build
ASAN_BUILD  ?= build-asan
RELEASE_BUILD ?= build-release
CMAKE_FLAGS ?=
PREFIX      ?= /usr/local

.PHONY: all deps build build-quiet run install test test-fast test-asan test-release bench fuzz format clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DTANDEM_WERROR=ON $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# The build without its ~100 lines of compiler and CMake output: one line, and the last lines of
# the log (kept in $(BUILD)/build.log) only when it fails.
build-quiet: deps
	@echo "== building tandem in $(BUILD)/ (log: $(BUILD)/build.log)"
	@mkdir -p $(BUILD)
	@{ [ -f $(BUILD)/CMakeCache.txt ] || cmake -S . -B $(BUILD) -DTANDEM_WERROR=ON $(CMAKE_FLAGS); } \
		>$(BUILD)/build.log 2>&1 && cmake --build $(BUILD) -j $(JOBS) >>$(BUILD)/build.log 2>&1 \
		|| { tail -n 40 $(BUILD)/build.log; echo "make: the build failed; full log: $(BUILD)/build.log"; exit 1; }

# The main job: three LoRA adapters trained fused on the CPU, each shown answering a prompt it
# never saw beside the bare base model, then GPU sharing on a simulated GPU.
run: build-quiet
	@scripts/demo.sh $(BUILD)/tandem

# Installs the binary into $(PREFIX)/bin and the docs into $(PREFIX)/share/doc/tandem
# (e.g. `make install PREFIX=$$HOME/.local`, then put $$HOME/.local/bin on PATH).
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# contract_check reads each test case's [ OK ] line from junit.xml: keep whole outputs (ctest cuts
# a passed test's output at 1024 bytes by default, which dropped the last cases of unit.ledger).
CTEST_KEEP_OUTPUT = --test-output-size-passed 1048576 --test-output-size-failed 1048576

# Every test through ctest, then the whole suite again under ASan + UBSan.
# contract_check then verifies that every test the contracts cite passed in that very run.
test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --output-junit junit.xml $(CTEST_KEEP_OUTPUT)
	$(BUILD)/contract_check --root . --junit $(BUILD)/junit.xml contracts/*.yaml
	$(MAKE) --no-print-directory test-release
	$(MAKE) --no-print-directory test-asan

# A Release (-O3) build of the tandem binary with warnings as errors: -O3 inlines more and so finds
# maybe-uninitialized paths the default RelWithDebInfo (-O2) build does not. Only the binary, CUDA
# off, to keep the cost small.
test-release: deps
	cmake -S . -B $(RELEASE_BUILD) -DCMAKE_BUILD_TYPE=Release -DTANDEM_WERROR=ON -DTANDEM_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(RELEASE_BUILD) -j $(JOBS) --target tandem

test-fast: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# CUDA is off here: libcublasLt under ASan makes every process start take ~0.7 s, which breaks the
# timing-based gpu-sharing tests; the CUDA code is built and tested by the normal build.
# -O1, as the sanitizers' own documentation advises (sibling calls kept out of the stack traces):
# at -O0 the CPU backend's loops made the suite CPU-bound at 909 s on the 2-core VM; at -O1 the
# heaviest tests run 2.2-2.8x faster (unit.trainer 81.5 -> 29.6 s alone) and -O1's warnings
# found an indeterminate read in generate's error path (docs/verification.md, 2026-12-07).
ASAN_CFLAGS = -g -O1 -fno-optimize-sibling-calls
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DTANDEM_WERROR=ON -DTANDEM_SANITIZE=ON -DTANDEM_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=$(ASAN_CFLAGS)" $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
		ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) --output-junit junit.xml $(CTEST_KEEP_OUTPUT)
	$(ASAN_BUILD)/contract_check --root . --junit $(ASAN_BUILD)/junit.xml contracts/*.yaml

bench: build
	@bench/run.sh $(BUILD)/tandem

# The libFuzzer targets (parsers only): CUDA off, since nvcc would hand clang's
# -fsanitize=fuzzer-no-link to its gcc host compiler, which rejects it.
fuzz: deps
	CC=clang cmake -S . -B build-fuzz -DTANDEM_FUZZ=ON -DTANDEM_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug $(CMAKE_FLAGS)
	cmake --build build-fuzz -j $(JOBS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(RELEASE_BUILD) build-fuzz
