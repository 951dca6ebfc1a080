#!/usr/bin/env bash
# campaign-summary.sh — one line per campaign log (tests/fuzz/campaign.sh): executions, exec/s,
# coverage (cov / ft), corpus size, crashes (crash, leak, timeout, oom artifacts), slow units (inputs over
# 10 s: reported, not failures), wall-clock and CPU seconds.
build=${1:-build-fuzz}
for log in "$build"/campaign-*.log; do
  t=$(basename "$log" .log); t=${t#campaign-}
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$')
  rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$')
  cov=$(echo "$last" | grep -oE 'cov: [0-9]+' | grep -oE '[0-9]+')
  ft=$(echo "$last" | grep -oE 'ft: [0-9]+' | grep -oE '[0-9]+')
  corp=$(echo "$last" | grep -oE 'corp: [0-9]+' | grep -oE '[0-9]+')
  crashes=$(ls "$build"/crash-"$t"-* 2>/dev/null | grep -vc -- '-slow-unit-')
  slow=$(ls "$build"/crash-"$t"-slow-unit-* 2>/dev/null | wc -l)
  cpu=$(grep -oE 'cpu_user_s=[0-9.]+ cpu_sys_s=[0-9.]+ wall_s=[0-9.]+' "$log")
  echo "$t: execs=${execs:-?} exec_per_s=${rate:-?} cov=${cov:-?} ft=${ft:-?} corpus=${corp:-?} crashes=$crashes slow_units=$slow $cpu $(tail -1 "$log")"
done
