#!/usr/bin/env bash
# `subagents fanout` beside a bare reqwest + tokio client, as a user runs
# them: whole commands, timed one process at a time, interleaved, against a
# local nginx that answers every chat completion with one fixed body.
#
#   cargo build --release --bin subagents --example bare_client
#   benches/side_by_side.sh [N] [ROUNDS] [C ...]      (default 10000 3 10 100 1000)
#
# For each concurrency C it runs both commands ROUNDS times, alternating,
# and prints each round, then the medians: runs a second (N ÷ wall time)
# and CPU seconds per 1,000 runs (user + system of the command alone, from
# wait4; nginx runs in its own processes and is not counted), with the
# ratios and verdicts of the goals: fanout's throughput ≥ 0.6 of the bare
# client's and its CPU per run ≤ 2× the bare client's.
#
# `fanout` runs with its default settings: sessions persisted under a
# fresh --home, result lines to stdout (here a file), a plain line per run
# on stderr (here a file), the summary. The load average at the start and
# the end is printed: wall times on a shared machine are only as good as
# the load beside them; the CPU figures move much less.
#
# SYSCALLS=1 also counts each command's system calls once per C
# (`strace -f -c`; it slows the commands, so it runs apart from the timed
# rounds) and prints them per 1,000 runs.
#
# Needs nginx (Debian: apt-get install nginx) and GNU time.
set -euo pipefail

N=${1:-10000}
ROUNDS=${2:-3}
shift $(( $# > 2 ? 2 : $# )) || true
CONCURRENCIES=("$@")
[ ${#CONCURRENCIES[@]} -gt 0 ] || CONCURRENCIES=(10 100 1000)

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
SUBAGENTS=${SUBAGENTS:-$TARGET/release/subagents}
BARE=${BARE:-$TARGET/release/examples/bare_client}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
for tool in "$SUBAGENTS" "$BARE" "$NGINX" /usr/bin/time; do
    [ -x "$tool" ] || { echo "side_by_side: $tool is missing (see the header)" >&2; exit 2; }
done

WORK=$(mktemp -d)
trap '[ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null; rm -rf "$WORK"' EXIT

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ANSWER='{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1}}'
mkdir -p "$WORK/nginx"
cat > "$WORK/nginx.conf" <<EOF
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx/error.log;
daemon on;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK/nginx;
    proxy_temp_path $WORK/nginx;
    fastcgi_temp_path $WORK/nginx;
    uwsgi_temp_path $WORK/nginx;
    scgi_temp_path $WORK/nginx;
    keepalive_requests 1000000;
    keepalive_timeout 60s;
    client_body_buffer_size 64k;
    server {
        listen 127.0.0.1:$PORT;
        location / {
            default_type application/json;
            return 200 '$ANSWER';
        }
    }
}
EOF
"$NGINX" -c "$WORK/nginx.conf" -p "$WORK/nginx" 2>/dev/null
BASE="http://127.0.0.1:$PORT/v1"

python3 - "$N" > "$WORK/tasks.jsonl" <<'EOF'
import json, sys
for i in range(int(sys.argv[1])):
    print(json.dumps({"prompt": f"task {i}: answer done"}))
EOF

# One command (`fanout` or `bare`), timed into $WORK/time ("wall user sys").
timed() {
    "$1" /usr/bin/time -f '%e %U %S' -o "$WORK/time" > "$WORK/stdout" 2> "$WORK/stderr" \
        || { echo "side_by_side: $1 failed" >&2; tail -5 "$WORK/stderr" >&2; exit 1; }
    local lines
    lines=$(grep -c . "$WORK/stdout" || true)
    [ "$lines" -eq "$N" ] || { echo "side_by_side: $1 wrote $lines result lines, not $N" >&2; tail -5 "$WORK/stderr" >&2; exit 1; }
}

# The commands, each under the prefix it is given (time, strace).
fanout() {
    local home="$WORK/home"
    rm -rf "$home"
    env OPENAI_BASE_URL="$BASE" OPENAI_API_KEY=none "$@" "$SUBAGENTS" fanout "$WORK/tasks.jsonl" \
        --model openai:m --concurrency "$C" --home "$home"
}

bare() {
    "$@" "$BARE" "$BASE/chat/completions" "$WORK/tasks.jsonl" "$C"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

echo "N = $N, $ROUNDS rounds, $(nproc) cores, load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for C in "${CONCURRENCIES[@]}"; do
    : > "$WORK/fanout.rates"; : > "$WORK/fanout.cpu"; : > "$WORK/bare.rates"; : > "$WORK/bare.cpu"
    for round in $(seq "$ROUNDS"); do
        for who in fanout bare; do
            timed "$who"
            read -r wall user sys < "$WORK/time"
            awk -v n="$N" -v w="$wall" 'BEGIN { printf "%.0f\n", n / w }' >> "$WORK/$who.rates"
            awk -v n="$N" -v u="$user" -v s="$sys" 'BEGIN { printf "%.4f\n", (u + s) * 1000 / n }' >> "$WORK/$who.cpu"
            printf 'C=%-5s round %s %-7s %6.2f s wall, %5.2f s user, %5.2f s sys\n' "$C" "$round" "$who" "$wall" "$user" "$sys"
        done
    done
    fr=$(median < "$WORK/fanout.rates"); fc=$(median < "$WORK/fanout.cpu")
    br=$(median < "$WORK/bare.rates"); bc=$(median < "$WORK/bare.cpu")
    awk -v c="$C" -v fr="$fr" -v fc="$fc" -v br="$br" -v bc="$bc" 'BEGIN {
        share = fr / br; cpu = fc / bc
        printf "C=%-5s fanout %6d runs/s (%.3f CPU s/1,000) | bare %6d runs/s (%.3f CPU s/1,000) | throughput %.2f of bare (goal >= 0.6: %s) | CPU %.2fx bare (goal <= 2: %s)\n",
            c, fr, fc, br, bc, share, (share >= 0.6 ? "met" : "missed"), cpu, (cpu <= 2 ? "met" : "missed")
    }'
    if [ "${SYSCALLS:-0}" = 1 ] && command -v strace > /dev/null; then
        for who in fanout bare; do
            "$who" strace -f -c -o "$WORK/$who.strace" > "$WORK/stdout" 2> "$WORK/stderr" || true
            calls=$(awk '$NF == "total" { print $(NF-2) }' "$WORK/$who.strace")
            awk -v c="$C" -v who="$who" -v calls="$calls" -v n="$N" \
                'BEGIN { printf "C=%-5s %-7s %d system calls per 1,000 runs\n", c, who, calls * 1000 / n }'
        done
    fi
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
