#!/bin/sh
# Builds the C++ client scenario (scenario.cc + the stubs `make gen` wrote to gen/cpp)
# into DIR/scenario; DIR defaults to build/cpp-scenario.
#
#   client/examples/cpp/build.sh [DIR]
#
# Needs g++ and pkg-config with Debian 12's libgrpc++-dev and libprotobuf-dev. Plain g++
# and pkg-config, no CMake: cmake is not among the toolchain packages `make client-tools`
# installs (in a CMake project, pkg_check_modules(... IMPORTED_TARGET grpc++ protobuf) works).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
GEN="$ROOT/gen/cpp"
OUT=${1:-"$ROOT/build/cpp-scenario"}
CXX=${CXX:-g++}

die() { echo "build.sh: $*" >&2; exit 1; }
[ -f "$GEN/llmserve/v1/llmserve.grpc.pb.cc" ] && [ -f "$GEN/google/rpc/status.pb.cc" ] ||
  die "$GEN is missing or incomplete: run make gen (or .venv/bin/python -m tools.gen --lang cpp)"
command -v "$CXX" >/dev/null || die "$CXX not found (apt-get install g++)"
command -v pkg-config >/dev/null || die "pkg-config not found (apt-get install pkg-config)"
pkg-config --exists grpc++ protobuf || die "pkg-config finds no grpc++ / protobuf (apt-get install libgrpc++-dev libprotobuf-dev)"

# The messages and stubs, and google.rpc Status / BadRequest / Code: vendored under
# proto/third_party and generated with the rest, as no Debian package ships their C++ code.
# The biggest file first, so the others compile beside it.
SOURCES="$GEN/llmserve/v1/llmserve.pb.cc $GEN/llmserve/v1/llmserve.grpc.pb.cc $HERE/scenario.cc
  $GEN/google/rpc/error_details.pb.cc $GEN/google/rpc/status.pb.cc $GEN/google/rpc/code.pb.cc"
# No -O: llmserve.pb.cc is half a megabyte, and optimising it takes minutes on 2 cores.
CXXFLAGS="${CXXFLAGS:-} -std=c++17 -pthread -I$GEN $(pkg-config --cflags grpc++ protobuf)"
LIBS="$(pkg-config --libs grpc++ protobuf)"
JOBS=$(nproc 2>/dev/null || echo 2)

mkdir -p "$OUT"
# Compile $JOBS files at a time (xargs -P), each to DIR/NAME.o, then link.
export CXX CXXFLAGS OUT
# shellcheck disable=SC2016  # $1, $CXX... expand in the inner shell
printf '%s\n' $SOURCES | xargs -P "$JOBS" -I{} sh -c '
  obj="$OUT/$(basename "$1" .cc).o"; echo "build.sh: compiling $1"
  $CXX $CXXFLAGS -c "$1" -o "$obj"' sh {} || die "compilation failed"
OBJECTS=""
for src in $SOURCES; do OBJECTS="$OBJECTS $OUT/$(basename "$src" .cc).o"; done
# shellcheck disable=SC2086  # word lists
$CXX -pthread $OBJECTS $LIBS -o "$OUT/scenario"
echo "build.sh: built $OUT/scenario"
