#!/bin/sh
# Build the collector's C tests under ASan+UBSan and under TSan and run them,
# concurrent and stop-the-world, with the verifier on:
#   stress.c      workers churning tables against back-to-back cycles
#   unpin_race.c  last unpins racing the sweep (TSan sees any access after it)
#   unit.c        deterministic checks (epoch wrap, deferred/device releases)
# Usage: gc/tests/run.sh [seconds per stress run]   (default 3)
#        gc/tests/run.sh --short                    (CI: 1 s runs, < 2 min on 2 cores)
set -e
cd "$(dirname "$0")/../.."
S=${1:-3}
[ "$S" = "--short" ] && S=1
OUT=${TMPDIR:-/tmp}/capqr_gc_tests.$$
mkdir -p "$OUT"
trap 'rm -rf "$OUT"' EXIT
SRC=$(ls gc/*.c)
CF="-std=gnu11 -g -O1 -pthread -Icapabilities -Igc"
for t in stress unpin_race unit; do
  gcc $CF -fsanitize=address,undefined -fno-sanitize-recover=undefined -o "$OUT/${t}_asan" $SRC "gc/tests/$t.c"
  gcc $CF -fsanitize=thread -o "$OUT/${t}_tsan" $SRC "gc/tests/$t.c"
done
export TSAN_OPTIONS=halt_on_error=1
for stw in 0 1; do
  export CAPQR_GC_VERIFY=1 CAPQR_GC_STW=$stw
  echo "== STW=$stw"
  "$OUT/unit_asan"
  "$OUT/unit_tsan"
  "$OUT/stress_asan" 8 "$S"
  "$OUT/stress_tsan" 4 "$S"
  "$OUT/unpin_race_asan" "$S"
  "$OUT/unpin_race_tsan" "$S"
done
# poison mode: released payloads are unmapped, so a late access faults
CAPQR_GC_VERIFY=1 CAPQR_GC_POISON=1 "$OUT/stress_asan" 4 "$S"
echo "gc/tests/run.sh: all passed"
