# kvllm — top-level wrapper around CMake/CTest.
#   make          build the release binary (no network)
#   make check    the contributor's loop (at most 5 minutes from a built tree): the release unit tests and
#                 the engine, server and CLI Python suites (ctest -L 'unit|python' -LE slow; README.md)
#   make test     bootstrap (packages + test venv), build, run the whole per-commit suite (CI's tier)
#   make nightly  make test, then what only repeats its coverage at greater length (ctest -L nightly:
#                 KLD on every quantization type, more strict twins), make fuzz and make soak
#   make demo     bootstrap, build, generate text from the default model, then answer one
#                 chat turn with SmolLM2-135M-Instruct (fetched by scripts/fetch-smollm2.sh;
#                 skipped with a note when it cannot be downloaded)
#   make fuzz     the libFuzzer targets (tests/fuzz), each for FUZZ_SECONDS (60)
#   make soak     SOAK_REQUESTS (3000) requests against the ASan kvllm serve, built optimized (tests/soak)
BUILD      ?= build
ASAN_BUILD ?= build-asan
# ASan + UBSan built optimized, for the long soak (the -O0 one answers 0.7 requests a second on a loaded machine)
ASAN_REL_BUILD ?= build-asan-rel
TSAN_BUILD ?= build-tsan
CLANG_BUILD ?= build-clang
FUZZ_BUILD ?= build-fuzz
# the CUDA backend's compile-and-link check (cuda-ci), where nvcc is
CUDA_BUILD ?= build-cuda
NVCC       ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
FUZZ_SECONDS ?= 60
# make test's share of fuzzing: seconds per target (the committed corpora are replayed in full first;
# make fuzz, in make nightly, searches longer)
FUZZ_CI_SECONDS ?= 10
FUZZ_TARGETS := gguf hf tokenizer_json jinja openai http
# the unit tests that run threads, built and run under ThreadSanitizer
TSAN_TESTS := test_core_threadpool test_engine_threads test_engine_share test_engine_faults
SOAK_REQUESTS ?= 3000
# make test's soaks: requests against the ASan server, and against the TSan one
SOAK_CI_REQUESTS ?= 200
SOAK_TSAN_REQUESTS ?= 80
SOAK_REL_REQUESTS ?= 1000
PYTHON     ?= .venv/bin/python
JOBS       ?= $(shell nproc)
# the tests' models, tokenizers and templates (tests/data/README.md); another copy of the same layout may stand in
SHARED     ?= $(abspath tests/data)

.PHONY: all build asan asan-rel tsan clang fuzz-build fuzz fuzz-ci soak soak-ci bootstrap check test nightly demo clean \
        cuda-ci

all: build

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DKVLLM_ASAN_BIN=$(abspath $(ASAN_BUILD))/kvllm >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# AddressSanitizer + UBSan build: the bad-input tests run its kvllm, and the
# C unit tests run there too.
asan:
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVLLM_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

asan-rel:
	@cmake -S . -B $(ASAN_REL_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVLLM_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_REL_BUILD) -j $(JOBS) --target kvllm

# ThreadSanitizer build of the threaded unit tests (and kvllm, for a short serve run).
tsan:
	@cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVLLM_SANITIZE=thread >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TESTS) kvllm

# Everything again with clang and -Werror (gcc's build above keeps its warnings as warnings).
clang:
	@cmake -S . -B $(CLANG_BUILD) -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Release -DKVLLM_WERROR=ON >/dev/null
	@cmake --build $(CLANG_BUILD) -j $(JOBS)

# libFuzzer targets (clang, -fsanitize=fuzzer,address,undefined).  New inputs go to
# $(FUZZ_BUILD)/corpus/<target>, crashes to $(FUZZ_BUILD)/crash-<target>-*; the committed
# seeds and regression inputs (tests/fuzz/corpus/<target>) are read, never written.
fuzz-build:
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVLLM_FUZZ=ON >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))

fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$t; log=$(FUZZ_BUILD)/fuzz-$$t.log; \
	  ASAN_OPTIONS=allocator_may_return_null=1 $(FUZZ_BUILD)/tests/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) \
	    -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crash-$$t- \
	    $(FUZZ_BUILD)/corpus/$$t tests/fuzz/corpus/$$t >$$log 2>&1; rc=$$?; \
	  echo "fuzz_$$t ($(FUZZ_SECONDS) s): $$(grep -E '^#[0-9]+[[:space:]]+DONE' $$log | tail -1)"; \
	  if [ $$rc -ne 0 ]; then tail -40 $$log; echo "fuzz_$$t failed (rc $$rc): the input is in $(FUZZ_BUILD)/crash-$$t-*"; exit 1; fi; \
	done

# make test's short run: every committed corpus file replayed (ctest), then FUZZ_CI_SECONDS per target
fuzz-ci: fuzz-build
	cd $(FUZZ_BUILD) && ASAN_OPTIONS=allocator_may_return_null=1 ctest --output-on-failure -R '^fuzz_replay_'
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(FUZZ_CI_SECONDS)

# Thousands of requests at concurrency 16 against the ASan kvllm serve (built optimized), a fifth
# cancelled (tests/soak/soak.py): 0 blocks held, no sanitizer report, RSS within 10 %, no failure.
soak: bootstrap asan-rel
	$(PYTHON) tests/soak/soak.py --bin $(ASAN_REL_BUILD)/kvllm --shared $(SHARED) --requests $(SOAK_REQUESTS)

# make test's short soaks.  Memory growth is held to 10 % on the release build (1,000 requests in
# about 5 s), loosely under ASan (its allocator wanders by several MB on a short run) and TSan (shadow
# memory grows with the addresses touched): there the reports are the point.
soak-ci: asan tsan build
	$(PYTHON) tests/soak/soak.py --bin $(BUILD)/kvllm --shared $(SHARED) --requests $(SOAK_REL_REQUESTS) \
	  --rss-tolerance 0.1
	$(PYTHON) tests/soak/soak.py --bin $(ASAN_BUILD)/kvllm --shared $(SHARED) --requests $(SOAK_CI_REQUESTS) \
	  --rss-tolerance 0.3
	$(PYTHON) tests/soak/soak.py --bin $(TSAN_BUILD)/kvllm --shared $(SHARED) --requests $(SOAK_TSAN_REQUESTS) \
	  --warmup 30 --rss-tolerance 0.5

bootstrap:
	@bash scripts/bootstrap.sh

# The fast tier on the release build only: the ASan runs inside the Python suites are make test's
# (KVLLM_NO_ASAN), as are the files labelled slow (tests/CMakeLists.txt says which and why).
check: bootstrap build
	cd $(BUILD) && KVLLM_NO_ASAN=1 ctest --output-on-failure -j $(JOBS) -L '^(unit|python)$$' -LE '^slow$$'

test: bootstrap asan tsan build
	# tests that ask for absurd allocations expect NULL, not an ASan abort
	cd $(ASAN_BUILD) && ASAN_OPTIONS=allocator_may_return_null=1 ctest --output-on-failure -j $(JOBS) -R '^unit_'
	# the threaded unit tests under ThreadSanitizer: any report fails the test
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) \
	  -R '^unit_($(subst $(eval) ,|,$(TSAN_TESTS)))$$'
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE '^nightly$$'
	@$(MAKE) --no-print-directory soak-ci
	@$(MAKE) --no-print-directory fuzz-ci
	@$(MAKE) --no-print-directory clang
	# the C unit tests of the clang build (its optimizer is not gcc's: docs/RELIABILITY.md)
	cd $(CLANG_BUILD) && ASAN_OPTIONS=allocator_may_return_null=1 ctest --output-on-failure -j $(JOBS) -R '^unit_'
	@$(MAKE) --no-print-directory cuda-ci

# Not per commit (about an hour on 2 cores): make test's tier, then its nightly-labelled repeats, the
# long fuzzing and the long soak.
nightly: test
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L '^nightly$$'
	@$(MAKE) --no-print-directory fuzz
	@$(MAKE) --no-print-directory soak

# Where nvcc is: build the CUDA backend (-DKVLLM_CUDA=ON), link kvllm with it, and run the unit
# tests that need no GPU (test_cuda_plan; test_cuda_errors, the error path on a faked runtime;
# test_backend_ops, which says "SKIP cuda: ..." without a
# device).  No GPU work here: that is scripts/gpu-check.sh (docs/GPU.md).  About 1.5 minutes on 2 cores (measured 1m23s from scratch).
cuda-ci:
	@if [ -z "$(NVCC)" ]; then echo "cuda-ci: no nvcc here: the CUDA backend is not built"; exit 0; fi; \
	cmake -S . -B $(CUDA_BUILD) -DCMAKE_BUILD_TYPE=Release -DKVLLM_CUDA=ON -DCMAKE_CUDA_COMPILER=$(NVCC) >/dev/null && \
	cmake --build $(CUDA_BUILD) -j $(JOBS) --target kvllm test_cuda_plan test_backend_ops test_cuda_errors gpu_timing && \
	cd $(CUDA_BUILD) && ctest --output-on-failure -R '^unit_test_(cuda_plan|backend_ops|cuda_errors)$$'

demo: bootstrap build
	@bash scripts/demo.sh $(BUILD)/kvllm $(SHARED) $(abspath models)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(ASAN_REL_BUILD) $(TSAN_BUILD) $(CLANG_BUILD) $(FUZZ_BUILD) $(CUDA_BUILD)
