#!/usr/bin/env bash
# campaign.sh — a long fuzzing campaign, measured in CPU time: each target named runs until its
# fuzzer process has had SECONDS of CPU (user + sys), in libFuzzer runs of at most CHUNK (600) s of
# wall-clock each, every run resuming from the corpus the earlier ones grew.  On a shared machine a
# wall-clock hour can give a target a minute of CPU (docs/RELIABILITY.md): counting CPU makes "an
# hour per target" mean an hour of fuzzing however busy the machine is, and lets a benchmark pause the
# campaign (kill -STOP / -CONT on the fuzz_* processes) without shortening it.  PAR targets run at
# once (default 1), at nice 19.
#
# Writes $build/campaign-<target>.log: every run's libFuzzer output, then per run a line
#   run=N cpu_user_s=U cpu_sys_s=S wall_s=W max_rss_kb=K exit=E
# and at the end "total cpu_s=... wall_s=... runs=... execs=..."; crashes go to
# $build/crash-<target>-* and stop that target's campaign (exit != 0 on its last run line), except a
# timeout (libFuzzer's, or fuzz_http's 60 s close deadline) whose input replays alone within the
# timeout (a run paused or starved: false-timeout-*).
# tests/fuzz/campaign-summary.sh turns the logs into docs/RELIABILITY.md's table.
#
# RESUME=1 continues a campaign an earlier invocation left (a session that ended, a reboot): the
# log is kept, its run lines count towards SECONDS, and its final "total" line is dropped so that
# the new one sums every run.
#
#   [PAR=n] [CHUNK=s] [RESUME=1] tests/fuzz/campaign.sh SECONDS [build-fuzz] [target ...]
set -u
secs=${1:?seconds of CPU per target}
build=${2:-build-fuzz}
shift $(( $# >= 2 ? 2 : $# ))
targets=${*:-gguf hf tokenizer_json jinja openai http}
chunk=${CHUNK:-600}
par=${PAR:-1}

one_target() {
  local t=$1 log="$build/campaign-$1.log" cpu=0 wall=0 runs=0 execs=0
  mkdir -p "$build/corpus/$t"
  if [ "${RESUME:-0}" = 1 ] && [ -f "$log" ]; then
    # Sum the earlier runs (CPU and wall from the run lines, executions from libFuzzer's final
    # stats, one per run) and drop the old total line.
    read -r cpu wall runs execs < <(awk '
      /^run=[0-9]+ cpu_user_s=/ { for (i = 2; i <= 4; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                                  c += v["cpu_user_s"] + v["cpu_sys_s"]; w += v["wall_s"]; r++ }
      /stat::number_of_executed_units:/ { e += $NF }
      END { printf "%.1f %.1f %d %d\n", c, w, r, e }' "$log")
    sed -i '/^total cpu_s=/d' "$log"
    echo "resumed: cpu_s=$cpu wall_s=$wall runs=$runs execs=$execs" >> "$log"
  else
    : > "$log"
  fi
  while awk -v c="$cpu" -v s="$secs" 'BEGIN { exit !(c < s) }'; do
    runs=$((runs + 1))
    local left tm rc
    left=$(awk -v c="$cpu" -v s="$secs" -v k="$chunk" 'BEGIN { l = s - c; if (l > k) l = k; printf "%d", l < 30 ? 30 : l }')
    tm=$(mktemp)
    ASAN_OPTIONS=allocator_may_return_null=1 nice -n 19 /usr/bin/time -o "$tm" \
        -f "cpu_user_s=%U cpu_sys_s=%S wall_s=%e max_rss_kb=%M" \
        "$build/tests/fuzz/fuzz_$t" -max_total_time="$left" -timeout=90 -rss_limit_mb=1536 -max_len=65536 \
        -print_final_stats=1 -artifact_prefix="$build/crash-$t-" "$build/corpus/$t" "tests/fuzz/corpus/$t" \
        >> "$log" 2>&1
    rc=$?
    echo "run=$runs $(grep -oE 'cpu_user_s=.*' "$tm") exit=$rc" >> "$log"
    local u s w e
    u=$(grep -oE 'cpu_user_s=[0-9.]+' "$tm" | cut -d= -f2); s=$(grep -oE 'cpu_sys_s=[0-9.]+' "$tm" | cut -d= -f2)
    w=$(grep -oE 'wall_s=[0-9.]+' "$tm" | cut -d= -f2)
    rm -f "$tm"
    e=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$')
    cpu=$(awk -v a="$cpu" -v u="${u:-0}" -v s="${s:-0}" 'BEGIN { printf "%.1f", a + u + s }')
    wall=$(awk -v a="$wall" -v w="${w:-0}" 'BEGIN { printf "%.1f", a + w }')
    execs=$((execs + ${e:-0}))
    # libFuzzer's timeout alarm counts wall-clock, and so does fuzz_http's own deadline (the server
    # closes within 60 s of a client's FIN): a run paused (SIGSTOP) or starved past either reports
    # the unit it was on.  Replayed alone within the timeout, it was a false alarm: the input is kept
    # as false-timeout-* and the campaign goes on; otherwise it is a finding.
    local art=""
    if [ "$rc" -eq 70 ]; then
      art=$(ls -t "$build"/crash-"$t"-timeout-* 2>/dev/null | head -1)
    elif [ "$t" = http ] && tail -c 200000 "$log" | grep -q "fuzz_http: the server did not close the connection"; then
      art=$(ls -t "$build"/crash-"$t"-crash-* 2>/dev/null | head -1)
    fi
    if [ -n "$art" ] && ASAN_OPTIONS=allocator_may_return_null=1 timeout 90 "$build/tests/fuzz/fuzz_$t" \
         -timeout=90 -rss_limit_mb=1536 "$art" > /dev/null 2>&1; then
      mv "$art" "$build/false-timeout-$t-$(basename "$art" | sed -E 's/.*-(timeout|crash)-//')"
      echo "run=$runs false timeout: $(basename "$art") replays within 90 s alone (kept as false-timeout-*)" >> "$log"
      continue
    fi
    [ "$rc" -ne 0 ] && break
  done
  echo "total cpu_s=$cpu wall_s=$wall runs=$runs execs=$execs" >> "$log"
}

running=0
for t in $targets; do
  one_target "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$par" ]; then wait -n; running=$((running - 1)); fi
done
wait
