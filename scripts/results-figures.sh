#!/usr/bin/env bash
# The plots of docs/results.md's "Ready scenarios and what they show": for each ready scenario, its comparison sweep
# (short: the fewest seeds and the shortest runs that still show the result) into results/figures/, then the one
# report figure that shows the result copied to docs/results/<scenario>.png.
#
#   bash scripts/results-figures.sh                          # every scenario below, in order
#   bash scripts/results-figures.sh incast-pfc qp-scaling    # some of them
#   bash scripts/results-figures.sh --list                   # each scenario's figure and sweep, nothing run
#
# Needs root (sweeps build namespaces). On a shared machine run it under the machine lock, a few scenarios at a
# time. Each sweep gets its own directory, results/figures/<scenario>-<time> (FIGURES_OUT: another parent), and
# keeps it: sweep.csv, comparison.csv, report.html, the runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TESTBED=${TESTBED:-.venv/bin/testbed}
OUT=${FIGURES_OUT:-results/figures}
DOCS=docs/results

# scenario | the report figure that shows its result (report_files/<name>.png) | the sweep's arguments
SWEEPS=(
  "ecmp-collisions|uplink-imbalance-per-config|--vary switch.load_balancing=ecmp,spray --seeds 8"
  "spray-utilisation|uplink-util-per-config|--vary switch.load_balancing=ecmp,flowlet,spray --seeds 3"
  "incast-pfc|losses-per-config|--vary switch.pfc.enabled=true,false --seeds 3 --include-flagged"
  "pfc-hol-victim|goodput-per-pair|--vary switch.pfc.enabled=true,false --seeds 3"
  "dcqcn-fairness|fairness-over-time|--vary traffic.cc=none,dcqcn --seeds 3"
  "alltoall-multirail|jct-per-job|--vary switch.load_balancing=ecmp,spray --seeds 2 --include-flagged"
  "spray-reordering|losses-per-config|--vary traffic.receiver=gbn,ooo --seeds 3 --include-flagged"
  "qp-scaling|jct-per-config|--vary traffic.qps_per_connection=1,4 --seeds 3"
  "ib-vs-roce|fct-cdf-per-config|--vary profile=infiniband,rocev2 --seeds 3"
  "asymmetric-wcmp|losses-per-config|--vary switch.load_balancing=ecmp,spray,wcmp --set duration=3s --seeds 2"
  "uec-incast|fct-cdf-per-config|--vary traffic.cc=none,dcqcn,nscc,eqds"
  "uec-spray-trim|losses-per-config|--vary switch.trim.enabled=true,false --seeds 3"
)

die() { echo "results-figures: $*" >&2; exit 1; }

entry() {   # entry NAME → the SWEEPS line of NAME
    local e
    for e in "${SWEEPS[@]}"; do
        [ "${e%%|*}" = "$1" ] && { echo "$e"; return 0; }
    done
    return 1
}

names=()
if [ "${1:-}" = "--list" ]; then
    for e in "${SWEEPS[@]}"; do
        IFS='|' read -r name fig args <<<"$e"
        printf '%-20s %-28s testbed sweep scenarios/%s.yaml %s\n' "$name" "$fig" "$name" "$args"
    done
    exit 0
elif [ $# -gt 0 ]; then
    for n in "$@"; do
        entry "$n" >/dev/null || die "no figure for '$n' (one of: $(for e in "${SWEEPS[@]}"; do printf '%s ' "${e%%|*}"; done))"
        names+=("$n")
    done
else
    for e in "${SWEEPS[@]}"; do names+=("${e%%|*}"); done
fi
[ -x "$TESTBED" ] || die "$TESTBED not found: run bash scripts/setup.sh first (or set TESTBED)"
mkdir -p "$DOCS" "$OUT"

t_all=$(date +%s)
for name in "${names[@]}"; do
    IFS='|' read -r _ fig args <<<"$(entry "$name")"
    read -ra argv <<<"$args"
    dir="$OUT/$name-$(date +%Y%m%d-%H%M%S)"
    t0=$(date +%s)
    echo "results-figures: $name: testbed sweep scenarios/$name.yaml $args --out $dir"
    "$TESTBED" sweep "scenarios/$name.yaml" "${argv[@]}" --out "$dir" \
        || die "$name: the sweep failed (exit $?); its runs are in $dir"
    png="$dir/report_files/$fig.png"
    [ -f "$png" ] || die "$name: the report has no $fig figure (see the note in $dir/report.md)"
    cp "$png" "$DOCS/$name.png"
    echo "results-figures: $name: $fig → $DOCS/$name.png ($(( $(stat -c %s "$png") / 1024 )) KB), $(( $(date +%s) - t0 )) s"
done
echo "results-figures: ${#names[@]} scenario(s) in $(( $(date +%s) - t_all )) s"
