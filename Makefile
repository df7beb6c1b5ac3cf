# tandem — the two commands a newcomer needs are `make run` and `make test` (see README.md).
# Everything else here is a convenience around CMake.
JOBS        ?= $(shell nproc)
BUILD       ?= build
ASAN_BUILD  ?= build-asan
CMAKE_FLAGS ?=

.PHONY: all deps build run test test-fast test-asan bench fuzz format clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DTANDEM_WERROR=ON $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# The main job: three LoRA adapters trained fused on the CPU, then GPU sharing on a simulated GPU.
run: build
	@scripts/demo.sh $(BUILD)/tandem

# Every test through ctest, then the whole suite again under ASan + UBSan.
# contract_check then verifies that every test the contracts cite passed in that very run.
test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --output-junit junit.xml
	$(BUILD)/contract_check --root . --junit $(BUILD)/junit.xml contracts/*.yaml
	$(MAKE) test-asan

test-fast: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# CUDA is off here: libcublasLt under ASan makes every process start take ~0.7 s, which breaks the
# timing-based gpu-sharing tests; the CUDA code is built and tested by the normal build.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DTANDEM_WERROR=ON -DTANDEM_SANITIZE=ON -DTANDEM_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
		ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) --output-junit junit.xml
	$(ASAN_BUILD)/contract_check --root . --junit $(ASAN_BUILD)/junit.xml contracts/*.yaml

bench: build
	@bench/run.sh $(BUILD)/tandem

fuzz: deps
	CC=clang cmake -S . -B build-fuzz -DTANDEM_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug $(CMAKE_FLAGS)
	cmake --build build-fuzz -j $(JOBS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-fuzz
