# The two commands: `make run` and `make test`. Plain `make` builds build/bin/lockstep.
.PHONY: all build deps run test test-release test-asan test-tsan clang clean

JOBS ?= $(shell nproc)

all: build

deps:
	scripts/install-deps

build:
	@[ -f build/build.ninja ] || cmake --preset release
	cmake --build build -j $(JOBS)

run: deps build
	build/bin/lockstep train

test: deps
	scripts/run-tests

test-release: build
	ctest --preset release

test-asan:
	@[ -f build-asan/build.ninja ] || cmake --preset asan
	cmake --build build-asan -j $(JOBS)
	ctest --preset asan

test-tsan:
	@[ -f build-tsan/build.ninja ] || cmake --preset tsan
	cmake --build build-tsan -j $(JOBS) --target lockstep_tests
	ctest --preset tsan

clang:
	@[ -f build-clang/build.ninja ] || cmake --preset clang
	cmake --build build-clang -j $(JOBS)

clean:
	rm -rf build build-asan build-tsan build-clang
