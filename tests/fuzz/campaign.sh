#!/usr/bin/env bash
# campaign.sh — a long fuzzing campaign: every target named runs at once, each for SECONDS of
# wall-clock at nice 19 (the machine is shared), from the committed corpus and what earlier runs
# found.  Writes $FUZZ_BUILD/campaign-<target>.log (libFuzzer's output, its final stats, and the
# CPU time from /usr/bin/time); crashes go to $FUZZ_BUILD/crash-<target>-*.  The figures in
# docs/RELIABILITY.md come from these logs (tests/fuzz/campaign-summary.sh).
#
#   tests/fuzz/campaign.sh SECONDS [build-fuzz] [target ...]
set -u
secs=${1:?seconds}
build=${2:-build-fuzz}
shift $(( $# >= 2 ? 2 : $# ))
targets=${*:-gguf hf tokenizer_json jinja openai http}
for t in $targets; do
  mkdir -p "$build/corpus/$t"
  ( ASAN_OPTIONS=allocator_may_return_null=1 nice -n 19 /usr/bin/time -f "cpu_user_s=%U cpu_sys_s=%S wall_s=%e max_rss_kb=%M" \
      "$build/tests/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=90 -rss_limit_mb=1536 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$build/crash-$t-" "$build/corpus/$t" "tests/fuzz/corpus/$t" \
      > "$build/campaign-$t.log" 2>&1
    echo "exit=$?" >> "$build/campaign-$t.log" ) &
done
wait
