# Endure's user-facing targets. `make demo` and `make test` work on a fresh
# Debian 12 machine: they install missing packages, build, then run.
BUILD ?= build
JOBS  ?= 2
CMAKE_FLAGS ?=
# The fuzz targets (fuzz/README.md): clang with libFuzzer, ASan and UBSan in
# a build directory of their own. `make fuzz` runs each for FUZZ_SECONDS
# (FUZZ_TARGETS: a subset, e.g. FUZZ_TARGETS="manifest tensors").
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=

.PHONY: all deps configure build demo test test-torch unit integration integration-loaded bench simtest \
        format clean fuzz-build fuzz fuzz-seeds

all: build

deps:
	@scripts/install-deps

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j$(JOBS)

demo: build
	scripts/demo

# The main suite, then a bounded run of each fuzz target (label fuzz).
test: build fuzz-build
	cd $(BUILD) && ctest --output-on-failure --timeout 900
	cd $(FUZZ_BUILD) && ctest --output-on-failure -L fuzz -j$(JOBS)

# The Python package's tests (ctest label python) twice: under Debian's
# python3 with its torch 1.13, as `make test` runs them, and in the torch 2.x
# virtualenv of scripts/torch-venv (made from PyPI on first use, then reused
# from ~/.cache/endure/torch-venv). `make test` does not need the venv.
test-torch: configure
	cmake --build $(BUILD) -j$(JOBS) --target endure _endure
	@py=$$(scripts/torch-venv) && scripts/test-torch --build $(BUILD) /usr/bin/python3 "$$py"

unit: build
	cd $(BUILD) && ctest --output-on-failure -L unit -j$(JOBS)

integration: build
	cd $(BUILD) && ctest --output-on-failure -L integration --timeout 900

# The integration suite on one core shared with a CPU hog: a test that orders
# a fault against a step by timing rather than by the events it waits for
# passes on one machine speed and fails on another (issue 28). Both ways must
# pass.
integration-loaded: build
	@scripts/with-cpu-hog taskset -c 0 sh -c 'cd $(BUILD) && ctest --output-on-failure -L integration --timeout 1800'

bench: build
	scripts/bench

# The deterministic cluster simulation (src/sim/cluster_sim.h) over SEEDS
# seeds from FIRST; prints the first seed that breaks an invariant and the
# command that replays it. SIMFLAGS: e.g. "--nodes 8 --ranks 4 --faults 20".
SEEDS ?= 1000
FIRST ?= 1
SIMFLAGS ?=
simtest: build
	$(BUILD)/bin/endure_simtest --seeds $(SEEDS) --first $(FIRST) $(SIMFLAGS)

$(FUZZ_BUILD)/CMakeCache.txt:
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DENDURE_FUZZ=ON -DENDURE_WITH_TORCH=OFF \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo

fuzz-build: deps $(FUZZ_BUILD)/CMakeCache.txt
	cmake --build $(FUZZ_BUILD) -j$(JOBS) --target endure_fuzz endure_libraries

# Each target in turn for FUZZ_SECONDS, keeping what it finds in
# $(FUZZ_BUILD)/fuzz/long/NAME; lists the targets that failed.
fuzz: fuzz-build
	@failed=""; \
	for bin in $(FUZZ_BUILD)/fuzz/bin/*_fuzz; do \
	  name=$$(basename $$bin _fuzz); \
	  if [ -n "$(FUZZ_TARGETS)" ] && ! echo " $(FUZZ_TARGETS) " | grep -q " $$name "; then continue; fi; \
	  fuzz/run $$bin $$name $(FUZZ_SECONDS) $(FUZZ_BUILD)/fuzz/long/$$name || failed="$$failed $$name"; \
	done; \
	if [ -n "$$failed" ]; then echo "make fuzz: failed:$$failed" >&2; exit 1; fi

# Rewrites the generated seeds fuzz/corpus/*/gen-* from the current formats.
fuzz-seeds: fuzz-build
	cmake --build $(FUZZ_BUILD) -j$(JOBS) --target fuzz_seeds
	$(FUZZ_BUILD)/fuzz/bin/fuzz_seeds fuzz/corpus

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD)
