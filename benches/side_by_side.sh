#!/usr/bin/env bash
# `subagents fanout` beside a bare reqwest + tokio client, as a user runs
# them: whole commands, timed one process at a time, interleaved, against a
# local nginx that answers every model call with one fixed body of its
# wire (chat completions, Responses, Anthropic Messages).
#
#   cargo build --release --bin subagents --example bare_client
#   benches/side_by_side.sh [N] [ROUNDS] [C ...]      (default 10000 3 10 100 1000)
#
# For each concurrency C it runs every command ROUNDS times, alternating,
# and prints each round, then the medians: runs a second (N ÷ wall time)
# and CPU seconds per 1,000 runs (user + system of the command alone, from
# wait4; nginx runs in its own processes and is not counted), with the
# ratios and verdicts of the goals: fanout's throughput ≥ 0.6 of the bare
# client's and its CPU per run ≤ 2× the bare client's.
#
# `fanout` runs once per adapter (ADAPTERS, default "openai
# openai-responses anthropic": `--model ADAPTER:m`) with its default
# settings: sessions persisted under a fresh --home, result lines to
# stdout (here a file), a plain line per run on stderr (here a file), the
# summary. The bare client posts chat completions; the three answers are
# the same few hundred bytes, so it is the floor for each. The load average
# at the start and the end is printed: wall times on a shared machine are
# only as good as the load beside them; the CPU figures move much less.
#
# AUTOAGENTS=PATH also times AutoAgents (a Rust agent framework) doing the
# same one-call runs (benches/frameworks/autoagents, built apart: see its
# Cargo.toml), and adds the goal that fanout's throughput is at least its.
#
# BEFORE=PATH also times another build of `subagents` (the one before a
# change) with each adapter, in the same rounds, and prints the new
# build's figures over its with a verdict: a change is claimed only where
# the two builds' middle halves of rounds (first to third quartile) do not
# overlap. Wall times and CPU on a shared machine move by a tenth or more
# from round to round: take nine rounds or more for a comparison.
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
read -r -a ADAPTERS <<< "${ADAPTERS:-openai openai-responses anthropic}"

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
SUBAGENTS=${SUBAGENTS:-$TARGET/release/subagents}
BARE=${BARE:-$TARGET/release/examples/bare_client}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
AUTOAGENTS=${AUTOAGENTS:-}
BEFORE=${BEFORE:-}
for tool in "$SUBAGENTS" "$BARE" "$NGINX" /usr/bin/time ${AUTOAGENTS:+"$AUTOAGENTS"} ${BEFORE:+"$BEFORE"}; do
    [ -x "$tool" ] || { echo "side_by_side: $tool is missing (see the header)" >&2; exit 2; }
done

WORK=$(mktemp -d)
trap '[ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null; rm -rf "$WORK"' EXIT

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ANSWER='{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}'
RESPONSE='{"id":"r","object":"response","status":"completed","output":[{"type":"message","id":"m","role":"assistant","content":[{"type":"output_text","text":"done","annotations":[]}]}],"usage":{"input_tokens":9,"output_tokens":1,"total_tokens":10}}'
MESSAGE='{"id":"m","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"done"}],"stop_reason":"end_turn","usage":{"input_tokens":9,"output_tokens":1}}'
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
        location = /v1/responses {
            default_type application/json;
            return 200 '$RESPONSE';
        }
        location = /v1/messages {
            default_type application/json;
            return 200 '$MESSAGE';
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

# One command (`fanout ADAPTER` or `bare`), timed into $WORK/time ("wall user sys").
timed() {
    local who=("$@")
    "${who[@]}" /usr/bin/time -f '%e %U %S' -o "$WORK/time" > "$WORK/stdout" 2> "$WORK/stderr" \
        || { echo "side_by_side: ${who[*]} failed" >&2; tail -5 "$WORK/stderr" >&2; exit 1; }
    local lines
    lines=$(grep -c . "$WORK/stdout" || true)
    [ "$lines" -eq "$N" ] || { echo "side_by_side: ${who[*]} wrote $lines result lines, not $N" >&2; tail -5 "$WORK/stderr" >&2; exit 1; }
    [ "$1" = bare ] || [ "$1" = autoagents ] || grep -q '"stop_reason":"completed"' "$WORK/stdout" \
        || { echo "side_by_side: ${who[*]} completed no run" >&2; tail -5 "$WORK/stderr" >&2; exit 1; }
}

# The commands, each under the prefix it is given (time, strace):
# `fanout ADAPTER` (`ADAPTER@before`: the BEFORE build) and `bare`.
fanout() {
    local adapter=$1 home="$WORK/home" build=$SUBAGENTS
    shift
    if [[ $adapter == *@before ]]; then adapter=${adapter%@before} build=$BEFORE; fi
    rm -rf "$home"
    env OPENAI_BASE_URL="$BASE" OPENAI_API_KEY=none ANTHROPIC_BASE_URL="${BASE%/v1}" ANTHROPIC_API_KEY=none \
        "$@" "$build" fanout "$WORK/tasks.jsonl" --model "$adapter:m" --concurrency "$C" --home "$home"
}

bare() {
    "$@" "$BARE" "$BASE/chat/completions" "$WORK/tasks.jsonl" "$C"
}

autoagents() {
    "$@" "$AUTOAGENTS" "$BASE/" "$WORK/tasks.jsonl" "$C"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# First and third quartile of the figures on stdin: "Q1 Q3".
quartiles() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 3) / 4)], v[int((3 * NR + 3) / 4)] }'; }
# "median (Q1–Q3)" of a figures file, with a printf format for each.
spread() { printf "$2 ($2–$2)" "$(median < "$1")" $(quartiles < "$1"); }

echo "N = $N, $ROUNDS rounds, $(nproc) cores, load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
BEFORES=()
[ -z "$BEFORE" ] || for adapter in "${ADAPTERS[@]}"; do BEFORES+=("$adapter@before"); done
WHO=("${ADAPTERS[@]}" "${BEFORES[@]}" ${AUTOAGENTS:+autoagents} bare)
for C in "${CONCURRENCIES[@]}"; do
    for who in "${WHO[@]}"; do : > "$WORK/$who.rates"; : > "$WORK/$who.cpu"; done
    for round in $(seq "$ROUNDS"); do
        for who in "${WHO[@]}"; do
            case $who in
                bare | autoagents) timed "$who" ;;
                *) timed fanout "$who" ;;
            esac
            read -r wall user sys < "$WORK/time"
            awk -v n="$N" -v w="$wall" 'BEGIN { printf "%.0f\n", n / w }' >> "$WORK/$who.rates"
            awk -v n="$N" -v u="$user" -v s="$sys" 'BEGIN { printf "%.4f\n", (u + s) * 1000 / n }' >> "$WORK/$who.cpu"
            printf 'C=%-5s round %s %-16s %6.2f s wall, %5.2f s user, %5.2f s sys\n' "$C" "$round" "$who" "$wall" "$user" "$sys"
        done
    done
    br=$(median < "$WORK/bare.rates"); bc=$(median < "$WORK/bare.cpu")
    printf 'C=%-5s bare client                          %s runs/s, %s CPU s/1,000\n' "$C" \
        "$(spread "$WORK/bare.rates" %d)" "$(spread "$WORK/bare.cpu" %.3f)"
    ar=0
    if [ -n "$AUTOAGENTS" ]; then
        ar=$(median < "$WORK/autoagents.rates")
        printf 'C=%-5s AutoAgents                           %s runs/s, %s CPU s/1,000\n' "$C" \
            "$(spread "$WORK/autoagents.rates" %d)" "$(spread "$WORK/autoagents.cpu" %.3f)"
    fi
    for adapter in "${ADAPTERS[@]}"; do
        fr=$(median < "$WORK/$adapter.rates"); fc=$(median < "$WORK/$adapter.cpu")
        awk -v c="$C" -v a="$adapter" -v fr="$fr" -v fc="$fc" -v br="$br" -v bc="$bc" -v ar="$ar" 'BEGIN {
            share = fr / br; cpu = fc / bc
            printf "C=%-5s fanout --model %-18s %6d runs/s (%.3f CPU s/1,000) | throughput %.2f of bare (goal >= 0.6: %s) | CPU %.2fx bare (goal <= 2: %s)",
                c, a ":m", fr, fc, share, (share >= 0.6 ? "met" : "missed"), cpu, (cpu <= 2 ? "met" : "missed")
            if (ar > 0) printf " | throughput %.2f of AutoAgents (goal >= 1: %s)", fr / ar, (fr >= ar ? "met" : "missed")
            printf "\n"
        }'
        printf 'C=%-5s   (spread over the rounds: %s runs/s, %s CPU s/1,000)\n' "$C" \
            "$(spread "$WORK/$adapter.rates" %d)" "$(spread "$WORK/$adapter.cpu" %.3f)"
        [ -n "$BEFORE" ] || continue
        before="$adapter@before"
        read -r rq1 rq3 < <(quartiles < "$WORK/$adapter.rates"); read -r bq1 bq3 < <(quartiles < "$WORK/$before.rates")
        read -r cq1 cq3 < <(quartiles < "$WORK/$adapter.cpu"); read -r dq1 dq3 < <(quartiles < "$WORK/$before.cpu")
        awk -v c="$C" -v a="$adapter" -v fr="$fr" -v fc="$fc" -v br="$(median < "$WORK/$before.rates")" -v bc="$(median < "$WORK/$before.cpu")" \
            -v rq1="$rq1" -v rq3="$rq3" -v bq1="$bq1" -v bq3="$bq3" -v cq1="$cq1" -v cq3="$cq3" -v dq1="$dq1" -v dq3="$dq3" 'BEGIN {
            apart = "changed (the middle halves do not overlap)"; near = "within the noise"
            printf "C=%-5s %s: this build over BEFORE: throughput %.2fx (%s), CPU per run %.2fx (%s)\n", c, a,
                fr / br, (rq1 > bq3 || rq3 < bq1 ? apart : near), fc / bc, (cq1 > dq3 || cq3 < dq1 ? apart : near)
        }'
        printf 'C=%-5s   BEFORE: %s runs/s, %s CPU s/1,000\n' "$C" "$(spread "$WORK/$before.rates" %d)" "$(spread "$WORK/$before.cpu" %.3f)"
    done
    if [ "${SYSCALLS:-0}" = 1 ] && command -v strace > /dev/null; then
        for who in "${WHO[@]}"; do
            if [ "$who" = bare ] || [ "$who" = autoagents ]; then
                "$who" strace -f -c -o "$WORK/$who.strace" > "$WORK/stdout" 2> "$WORK/stderr" || true
            else
                fanout "$who" strace -f -c -o "$WORK/$who.strace" > "$WORK/stdout" 2> "$WORK/stderr" || true
            fi
            calls=$(awk '$NF == "total" { print $(NF-2) }' "$WORK/$who.strace")
            awk -v c="$C" -v who="$who" -v calls="$calls" -v n="$N" \
                'BEGIN { printf "C=%-5s %-16s %d system calls per 1,000 runs\n", c, who, calls * 1000 / n }'
        done
    fi
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
