#!/usr/bin/env bash
# campaign-summary.sh — one line per campaign log (tests/fuzz/campaign.sh): CPU and wall-clock
# seconds, libFuzzer runs, executions (summed over the runs), exec/s of CPU, coverage (cov / ft) and
# corpus at the end of the last run, crashes (crash, leak, timeout, oom artifacts) and slow units
# (inputs over 10 s: reported, not failures).
build=${1:-build-fuzz}
for log in "$build"/campaign-*.log; do
  t=$(basename "$log" .log); t=${t#campaign-}
  total=$(grep -E '^total ' "$log" | tail -1)
  cpu=$(echo "$total" | grep -oE 'cpu_s=[0-9.]+' | cut -d= -f2)
  execs=$(echo "$total" | grep -oE 'execs=[0-9]+' | cut -d= -f2)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(echo "$last" | grep -oE 'cov: [0-9]+' | grep -oE '[0-9]+')
  ft=$(echo "$last" | grep -oE 'ft: [0-9]+' | grep -oE '[0-9]+')
  corp=$(echo "$last" | grep -oE 'corp: [0-9]+' | grep -oE '[0-9]+')
  rate=$(awk -v e="${execs:-0}" -v c="${cpu:-0}" 'BEGIN { if (c > 0) printf "%.0f", e / c; else print "?" }')
  crashes=$(ls "$build"/crash-"$t"-* 2>/dev/null | grep -vc -- '-slow-unit-')
  slow=$(ls "$build"/crash-"$t"-slow-unit-* 2>/dev/null | wc -l)
  echo "$t: ${total:-unfinished} exec_per_cpu_s=$rate cov=${cov:-?} ft=${ft:-?} corpus=${corp:-?} crashes=$crashes slow_units=$slow"
done
