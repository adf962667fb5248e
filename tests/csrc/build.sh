#!/usr/bin/env bash
# Build the standalone kernel test (tests/csrc/test_kernels.cpp) with every ISA variant of the
# target architecture linked in, each from csrc/cpu/kernels.cpp with its own flags -- the same
# variants and flags setup.py uses for the Python extension.
#
#   tests/csrc/build.sh x86_64  OUT     # native g++ (CXX=... to override)
#   tests/csrc/build.sh aarch64 OUT     # aarch64-linux-gnu-g++, statically linked for qemu-aarch64
# Also builds OUT-quant: tests/csrc/test_quant.cpp (the INT8 / INT4 linear kernels, quant_kernels.cpp).
set -euo pipefail
ARCH=${1:?arch: x86_64 or aarch64}
OUT=${2:?output binary}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CSRC="$ROOT/csrc/cpu"
COMMON="-O3 -std=c++17 -ffp-contract=off -fno-math-errno -Wall -Wno-unused-function -Wno-maybe-uninitialized -Wno-uninitialized -I$CSRC"
AVX512="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c"
case "$ARCH" in
  x86_64)
    CXX=${CXX:-g++}
    LINK_EXTRA=""
    VARIANTS=("avx512_bf16|OCTAVO_ISA_AVX512|$AVX512 -mavx512bf16" "avx512|OCTAVO_ISA_AVX512|$AVX512"
              "avx2|OCTAVO_ISA_AVX2|-mavx2 -mfma -mf16c" "scalar|OCTAVO_ISA_SCALAR|")
    ;;
  aarch64)
    CXX=${CXX:-aarch64-linux-gnu-g++}
    LINK_EXTRA="-static"
    VARIANTS=("neon|OCTAVO_ISA_NEON|" "scalar|OCTAVO_ISA_SCALAR|")
    ;;
  *) echo "unknown arch $ARCH" >&2; exit 2 ;;
esac
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
OBJS=()
QOBJS=()
for v in "${VARIANTS[@]}"; do
  IFS='|' read -r name macro flags <<<"$v"
  # shellcheck disable=SC2086
  "$CXX" $COMMON $flags -D"$macro"=1 -DOCTAVO_ISA_NS="isa_$name" -c "$CSRC/kernels.cpp" -o "$TMP/kernels_$name.o" &
  OBJS+=("$TMP/kernels_$name.o")
  # shellcheck disable=SC2086
  "$CXX" $COMMON $flags -D"$macro"=1 -DOCTAVO_ISA_NS="isa_$name" -c "$CSRC/quant_kernels.cpp" -o "$TMP/quant_$name.o" &
  QOBJS+=("$TMP/quant_$name.o")
  # shellcheck disable=SC2086
  "$CXX" $COMMON $flags -D"$macro"=1 -DOCTAVO_ISA_NS="isa_$name" -c "$CSRC/gemv.cpp" -o "$TMP/gemv_$name.o" &
  OBJS+=("$TMP/gemv_$name.o")
done
# shellcheck disable=SC2086
"$CXX" $COMMON -fopenmp -c "$CSRC/threading.cpp" -o "$TMP/threading.o" &
# shellcheck disable=SC2086
"$CXX" $COMMON -fopenmp -c "$ROOT/tests/csrc/test_kernels.cpp" -o "$TMP/test.o" &
# shellcheck disable=SC2086
"$CXX" $COMMON -fopenmp -c "$ROOT/tests/csrc/test_quant.cpp" -o "$TMP/test_quant.o" &
wait
# shellcheck disable=SC2086
"$CXX" $LINK_EXTRA -fopenmp -o "$OUT" "$TMP/test.o" "$TMP/threading.o" "${OBJS[@]}" -ldl -lpthread
# shellcheck disable=SC2086
"$CXX" $LINK_EXTRA -fopenmp -o "$OUT-quant" "$TMP/test_quant.o" "$TMP/threading.o" "${QOBJS[@]}" -ldl -lpthread
echo "built $OUT and $OUT-quant ($ARCH: ${#VARIANTS[@]} variants)"
