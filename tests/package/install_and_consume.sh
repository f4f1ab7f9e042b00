#!/usr/bin/env bash
# CTest's Package.InstallAndFindPackage: liblockstep installs, and a program of its own uses
# it each way docs/architecture.md ("Build") describes:
#   1. cmake --install of this build into a fresh prefix: the headers, liblockstep.a, the CMake
#      package and lockstep.pc are there, and the exported target carries none of Lockstep's
#      own build flags (-march=native, warnings, sanitizers) and no path of this tree;
#   2. examples/ configured as a project of its own against that prefix (find_package(Lockstep),
#      C++20 from the package alone), built, and every example run;
#   3. a one-file program built with `c++ prog.cpp $(pkg-config --cflags --libs lockstep)` and run;
#   4. a project that does add_subdirectory(<lockstep source>) and links Lockstep::lockstep,
#      configured (not built: that would compile the library again): the library only, no
#      command, tests or examples.
#
# Usage: install_and_consume.sh <lockstep source dir> <lockstep build dir>
# Environment (tests/CMakeLists.txt sets them from the build): CMAKE, CXX, LOCKSTEP_CUDA,
# LOCKSTEP_VERSION_STRING. Everything is written under a temporary directory, removed on exit.
set -euo pipefail

fail() {
  echo "Package.InstallAndFindPackage FAILED: $*" >&2
  exit 1
}
[ $# -eq 2 ] || fail "usage: $0 <lockstep source dir> <lockstep build dir>"
src=$(cd "$1" && pwd) || fail "no source directory $1"
bin=$(cd "$2" && pwd) || fail "no build directory $2"
cmake=${CMAKE:-cmake}
cxx=${CXX:-c++}
cuda=${LOCKSTEP_CUDA:-OFF}
jobs=2
generator=()
if command -v ninja > /dev/null; then generator=(-G Ninja); fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-package.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

step() { echo "-- $*"; }
# run <what failed> <command...>: the command's output is shown only when it fails.
run() {
  local what=$1
  shift
  if ! "$@" > "$tmp/last.log" 2>&1; then
    cat "$tmp/last.log" >&2
    fail "$what (command: $*)"
  fi
}
# A launcher's variables would make ddp_train wait for ranks that never come: the examples run
# as a world of one.
no_launcher=(env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT
             -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_LOCAL_RANK
             -u OMPI_COMM_WORLD_LOCAL_SIZE -u SLURM_PROCID -u SLURM_NTASKS -u SLURM_LOCALID
             -u SLURM_TASKS_PER_NODE)

# 1. Install.
step "cmake --install $bin --prefix $prefix"
run "cmake --install failed: is the build complete (cmake --build $bin)?" \
  "$cmake" --install "$bin" --prefix "$prefix"
library=$(find "$prefix" -name liblockstep.a -print -quit)
[ -n "$library" ] || fail "no liblockstep.a under $prefix"
libdir=$(dirname "$library")
package_dir=$libdir/cmake/Lockstep
for file in "$prefix/include/lockstep/core/tensor.h" "$prefix/include/lockstep/ops/ops.h" \
            "$package_dir/LockstepConfig.cmake" "$package_dir/LockstepConfigVersion.cmake" \
            "$package_dir/LockstepTargets.cmake" "$libdir/pkgconfig/lockstep.pc"; do
  [ -f "$file" ] || fail "cmake --install did not install $file"
done
headers_in_tree=$(cd "$src/src" && find lockstep -name '*.h' | sort)
headers_installed=$(cd "$prefix/include" && find lockstep -name '*.h' | sort)
[ "$headers_in_tree" = "$headers_installed" ] ||
  fail "the installed headers are not src/lockstep's: $(diff <(echo "$headers_in_tree") <(echo "$headers_installed") | head -5)"

step "the exported target's interface"
targets=("$package_dir"/LockstepTargets*.cmake)
grep -q 'INTERFACE_COMPILE_FEATURES "cxx_std_20"' "$package_dir/LockstepTargets.cmake" ||
  fail "Lockstep::lockstep does not require cxx_std_20 (LockstepTargets.cmake)"
if leaked=$(grep -n -E -e '-march=|-mtune=|-W(all|extra|error|no-)|-fsanitize|-fno-omit-frame-pointer|-fno-sanitize' \
              "${targets[@]}" "$libdir/pkgconfig/lockstep.pc"); then
  fail "Lockstep's own build flags reach its consumers: $leaked"
fi
if leaked=$(grep -n -F -e "$src/" -e "$bin" "${targets[@]}" "$package_dir/LockstepConfig.cmake" \
              "$libdir/pkgconfig/lockstep.pc"); then
  fail "the installed package points into the source or build tree: $leaked"
fi

# 2. The examples as a project of their own, found through the CMake package. -O1: quick.
step "examples/ as a project of its own: find_package(Lockstep) from $prefix"
examples=$tmp/examples
run "configuring examples/ against the installed package failed" \
  "$cmake" -S "$src/examples" -B "$examples" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" "-DCMAKE_CXX_COMPILER=$cxx" "-DCMAKE_PREFIX_PATH=$prefix" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_EXPORT_COMPILE_COMMANDS=ON
found=$(sed -n 's/^Lockstep_DIR:PATH=//p' "$examples/CMakeCache.txt")
[ "$found" -ef "$package_dir" ] || fail "find_package(Lockstep) found $found, not $package_dir"
run "building examples/ against the installed package failed" "$cmake" --build "$examples" -j "$jobs"
grep -q -E -e '-std=(c|gnu)\+\+20' "$examples/compile_commands.json" ||
  fail "the examples do not compile as C++20: the package did not pass cxx_std_20 on"
if grep -q -E -e '-march=native|-Werror|-fsanitize' "$examples/compile_commands.json"; then
  fail "Lockstep's own build flags reach the examples' compile lines"
fi

for source in "$src"/examples/*.cpp; do
  name=$(basename "$source" .cpp)
  program=$examples/$name
  [ -x "$program" ] || fail "example $name was not built ($program)"
  args=()
  if grep -q -e '"--devices"' "$source"; then args=(--devices 1); fi
  if grep -q -e 'fashion_mnist' "$source" && [ ! -d /usr/share/datasets/fashion-mnist ]; then
    step "$name: not run, Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"
    continue
  fi
  step "run $name${args[*]:+ ${args[*]}}"
  if ! "${no_launcher[@]}" timeout 300 "$program" "${args[@]}" > "$tmp/$name.out" 2>&1; then
    cat "$tmp/$name.out" >&2
    fail "example $name ${args[*]} failed (built against the installed package)"
  fi
  if [ "$name" = regression ]; then
    last=$(tail -n 1 "$tmp/$name.out")
    [[ "$last" =~ ^weights_sha256\ [0-9a-f]{64}$ ]] ||
      fail "regression's last line is \"$last\", not weights_sha256 and 64 hex digits"
    echo "   $last"
    # Built against the package with other flags, the same weights as this build's own copy.
    if [ -x "$bin/bin/regression" ]; then
      own=$("$bin/bin/regression" --devices 1 | tail -n 1)
      [ "$own" = "$last" ] || fail "regression against the installed package ends with \"$last\", this build's own with \"$own\""
    fi
  fi
done

# 3. pkg-config.
step "pkg-config --cflags --libs lockstep"
export PKG_CONFIG_PATH=$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
command -v pkg-config > /dev/null || fail "pkg-config is not installed"
run "pkg-config cannot read lockstep.pc or a module it requires" pkg-config --print-errors --exists lockstep
flags=$(pkg-config --cflags --libs lockstep)
echo "   $flags"
[[ " $flags " == *" -std=c++20 "* && " $flags " == *" -llockstep "* ]] ||
  fail "pkg-config's flags lack -std=c++20 or -llockstep: $flags"
if [ -n "${LOCKSTEP_VERSION_STRING:-}" ]; then
  version=$(pkg-config --modversion lockstep)
  [ "$version" = "$LOCKSTEP_VERSION_STRING" ] ||
    fail "lockstep.pc says version $version, the build is $LOCKSTEP_VERSION_STRING"
fi
consumer=$tmp/consumer.cpp
cat > "$consumer" << 'EOF'
#include <cstdio>
#include <vector>

#include "lockstep/core/tensor.h"
#include "lockstep/ops/ops.h"

int main() {
  using namespace lockstep;
  const Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = Tensor::ones({3, 2});
  std::printf("sum %g\n", sum(matmul(a, b)).item());  // [[6, 6], [15, 15]]: 42
  return 0;
}
EOF
# shellcheck disable=SC2086  # the flags are words
run "a one-file program did not build with $cxx \$(pkg-config --cflags --libs lockstep)" \
  "$cxx" -O1 "$consumer" -o "$tmp/consumer" $flags
run "the pkg-config-built program failed" "$tmp/consumer"
output=$(cat "$tmp/last.log")
[ "$output" = "sum 42" ] || fail "the pkg-config-built program printed \"$output\", not \"sum 42\""

# 4. add_subdirectory.
step "add_subdirectory($src lockstep): configure"
project=$tmp/subdirectory
mkdir -p "$project"
cp "$consumer" "$project/consumer.cpp"
cat > "$project/CMakeLists.txt" << EOF
cmake_minimum_required(VERSION 3.25)
project(lockstep_subdirectory_consumer CXX)
add_subdirectory("$src" lockstep)
if(NOT TARGET Lockstep::lockstep)
  message(FATAL_ERROR "add_subdirectory(lockstep) defines no Lockstep::lockstep")
endif()
foreach(target lockstep lockstep_tools lockstep_tests nvml_standin ddp_train regression train_throughput)
  if(TARGET \${target})
    message(FATAL_ERROR "add_subdirectory(lockstep) defines \${target}: only the library is wanted")
  endif()
endforeach()
add_executable(consumer consumer.cpp)
target_link_libraries(consumer PRIVATE Lockstep::lockstep)
EOF
run "configuring a project that does add_subdirectory(lockstep) failed" \
  "$cmake" -S "$project" -B "$project/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CXX_COMPILER=$cxx" "-DLOCKSTEP_CUDA=$cuda"
run "the add_subdirectory project has no build system" "$cmake" --build "$project/build" --target help
if extra=$(grep -E '^(\.\.\. )?(lockstep|lockstep_tools|lockstep_tests|ddp_train|regression)(:| |$)' "$tmp/last.log"); then
  fail "add_subdirectory(lockstep) builds more than the library: $extra"
fi
grep -q -E '^(\.\.\. )?lockstep_lib(:| |$)' "$tmp/last.log" || fail "add_subdirectory(lockstep) has no lockstep_lib to build"

echo "Package.InstallAndFindPackage: passed"
