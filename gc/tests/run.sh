#!/bin/sh
# Build and run the collector stress driver under ASan and TSan, concurrent
# and stop-the-world, with the verifier on.  Usage: gc/tests/run.sh [seconds]
set -e
cd "$(dirname "$0")/../.."
S=${1:-3}
SRC="gc/fugc.c gc/heap.c gc/handshake.c gc/mark.c gc/sweep.c gc/verify.c gc/stats.c gc/tests/stress.c"
CF="-std=gnu11 -g -O1 -pthread -Icapabilities -Igc"
gcc $CF -fsanitize=address,undefined -o /tmp/capqr_gc_asan $SRC
gcc $CF -fsanitize=thread -o /tmp/capqr_gc_tsan $SRC
for stw in 0 1; do
  CAPQR_GC_VERIFY=1 CAPQR_GC_STW=$stw /tmp/capqr_gc_asan 8 "$S"
  CAPQR_GC_VERIFY=1 CAPQR_GC_STW=$stw TSAN_OPTIONS=halt_on_error=1 /tmp/capqr_gc_tsan 4 "$S"
done
