# Endure's user-facing targets. `make demo` and `make test` work on a fresh
# Debian 12 machine: they install missing packages, build, then run.
BUILD ?= build
JOBS  ?= 2
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test unit integration bench format clean

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

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 900

unit: build
	cd $(BUILD) && ctest --output-on-failure -L unit -j$(JOBS)

integration: build
	cd $(BUILD) && ctest --output-on-failure -L integration --timeout 900

bench: build
	scripts/bench

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD)
