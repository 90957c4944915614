# The two entry points of the README: `make run` and `make test`.
# Both run the idempotent setup script first, then build with CMake + Ninja.

BUILD      ?= build
BUILD_SAN  ?= build-asan
MODEL      ?= ../shared/models/stories260K/stories260K-F32.gguf
PROMPT     ?= Once upon a time
JOBS       ?= $(shell nproc)

.PHONY: all setup build run test test-fast test-asan clean

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/llmopt run $(MODEL) -p "$(PROMPT)" -n 200

# Whole suite: a -Werror release build, then again under ASan + UBSan.
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) test-asan

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: setup
	cmake -S . -B $(BUILD_SAN) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DLLMOPT_SANITIZE=ON
	cmake --build $(BUILD_SAN) -j $(JOBS)
	cd $(BUILD_SAN) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    LLMOPT_TEST_SANITIZED=1 ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) $(BUILD_SAN)
