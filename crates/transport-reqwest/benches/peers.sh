#!/usr/bin/env bash
# The peers benchmark of issue 6, in full: CPU time per request of ResilientClient,
# reqwest-middleware + reqwest-retry, a tower stack, and two references (raw reqwest
# under a 10 s tokio timeout; raw reqwest plus the pool's parts called in line) as
# ratios to raw reqwest
# (benches/peers.rs, pinned to one core with taskset), then, if valgrind is
# installed, instructions per request counted by callgrind for each kind and
# concurrency. Prints both tables in Markdown at the end.
#
# Usage: crates/transport-reqwest/benches/peers.sh
# Environment: PEERS_CPU (the core to pin to, default the first this process may
# use), PEERS_ROUNDS and
# PEERS_SCALE (passed to the bench), PEERS_VALGRIND_REQUESTS (requests per callgrind
# run, a multiple of 128, default 2048), PEERS_SKIP_CPU=1 / PEERS_SKIP_VALGRIND=1.
# About 4 minutes on a 2-core machine once built.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."

# The first core this process may run on (in a container's cpuset it need not be 0).
first_cpu() {
    local allowed
    allowed=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status 2>/dev/null || true)
    allowed=${allowed%%[,-]*}
    printf '%s' "${allowed:-0}"
}
cpu=${PEERS_CPU:-$(first_cpu)}
vg_requests=${PEERS_VALGRIND_REQUESTS:-2048}
kinds=(floor reqwest timeout parts resilient middleware tower)
concs=(1 16 128)

echo "==> building the bench (cargo bench --no-run)" >&2
bin=$(cargo bench -p vantage-api-pool-reqwest --bench peers --no-run --message-format=json-render-diagnostics |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
if [[ -z $bin || ! -x $bin ]]; then
    echo "could not find the bench executable; run: cargo bench -p vantage-api-pool-reqwest --bench peers --no-run" >&2
    exit 1
fi

pin=()
if command -v taskset >/dev/null; then
    pin=(taskset -c "$cpu")
else
    echo "taskset not found: the bench runs unpinned" >&2
fi

cpu_table=""
if [[ ${PEERS_SKIP_CPU:-0} != 1 ]]; then
    echo "==> CPU time per request: ${pin[*]} $bin" >&2
    cpu_table=$("${pin[@]}" "$bin")
fi

inst_table=""
if [[ ${PEERS_SKIP_VALGRIND:-0} != 1 ]] && command -v valgrind >/dev/null; then
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
    declare -A ir
    for c in "${concs[@]}"; do
        for k in "${kinds[@]}"; do
            echo "==> callgrind: $k, concurrency $c, $vg_requests requests" >&2
            "${pin[@]}" valgrind --tool=callgrind --collect-atstart=no \
                --toggle-collect='*callgrind_measured_section*' \
                --callgrind-out-file="$out/$k.$c" \
                "$bin" --only "$k" "$c" "$vg_requests" >/dev/null 2>"$out/$k.$c.log" || {
                cat "$out/$k.$c.log" >&2
                exit 1
            }
            ir[$k.$c]=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/$k.$c")
        done
    done
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
    per() { awk -v a="$1" -v n="$vg_requests" 'BEGIN { printf "%.0f", a / n }'; }
    label() {
        case $1 in
            timeout) echo "raw reqwest + a 10 s tokio timeout (reference)" ;;
            parts) echo "raw reqwest + the contract's parts in line (reference)" ;;
            resilient) echo "ResilientClient" ;;
            middleware) echo "reqwest-middleware + reqwest-retry" ;;
            tower) echo "tower (buffer, limit, rate, retry)" ;;
        esac
    }
    inst_table+=$'\n'"Instructions per request (callgrind, user space, client + server), ratio to raw reqwest; $vg_requests requests per run"$'\n\n'
    inst_table+="| client | c=1 | c=16 | c=128 |"$'\n'"|---|---|---|---|"$'\n'
    row="| raw reqwest, absolute |"
    for c in "${concs[@]}"; do row+=" $(per "${ir[reqwest.$c]}") |"; done
    inst_table+="$row"$'\n'
    row="| floor (raw TCP, no client), absolute |"
    for c in "${concs[@]}"; do row+=" $(per "${ir[floor.$c]}") |"; done
    inst_table+="$row"$'\n'
    for k in timeout parts resilient middleware tower; do
        row="| $(label "$k") |"
        for c in "${concs[@]}"; do row+=" $(ratio "${ir[$k.$c]}" "${ir[reqwest.$c]}") |"; done
        inst_table+="$row"$'\n'
    done
    inst_table+=$'\n'"Client's own share, (kind - floor) / (raw reqwest - floor):"$'\n\n'
    inst_table+="| client | c=1 | c=16 | c=128 |"$'\n'"|---|---|---|---|"$'\n'
    for k in timeout parts resilient middleware tower; do
        row="| $(label "$k") |"
        for c in "${concs[@]}"; do
            row+=" $(ratio "$((ir[$k.$c] - ir[floor.$c]))" "$((ir[reqwest.$c] - ir[floor.$c]))") |"
        done
        inst_table+="$row"$'\n'
    done
elif [[ ${PEERS_SKIP_VALGRIND:-0} != 1 ]]; then
    inst_table=$'\n'"(valgrind not installed: no instruction counts)"$'\n'
fi

printf '%s\n%s' "$cpu_table" "$inst_table"
