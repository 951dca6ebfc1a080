# kvllm — top-level wrapper around CMake/CTest.
#   make          build the release binary (no network)
#   make test     bootstrap (packages + test venv), build, run the whole suite
#   make demo     bootstrap, build, generate text from the default model, then answer one
#                 chat turn with SmolLM2-135M-Instruct (fetched by scripts/fetch-smollm2.sh;
#                 skipped with a note when it cannot be downloaded)
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
SHARED     ?= $(abspath ../shared)

.PHONY: all build asan bootstrap test demo clean

all: build

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DKVLLM_ASAN_BIN=$(abspath $(ASAN_BUILD))/kvllm >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# AddressSanitizer + UBSan build: the bad-input tests run its kvllm, and the
# C unit tests run there too.
asan:
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVLLM_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

bootstrap:
	@bash scripts/bootstrap.sh

test: bootstrap asan build
	# tests that ask for absurd allocations expect NULL, not an ASan abort
	cd $(ASAN_BUILD) && ASAN_OPTIONS=allocator_may_return_null=1 ctest --output-on-failure -j $(JOBS) -R '^unit_'
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: bootstrap build
	@bash scripts/demo.sh $(BUILD)/kvllm $(SHARED) $(abspath models)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
