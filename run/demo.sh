#!/usr/bin/env bash
# Usage: run/demo.sh [PORTS] [OUT]
#   Starts a simulated 8-server SGLang fleet on localhost, runs `gen-pipeline generate` over
#   prompts/sample.jsonl against it, prints the summary, and stops the fleet.
#   PORTS defaults to 31000-31007 (away from a real fleet on 30000-30007); OUT to runs/demo.
#   Run it twice: the second run resumes and has nothing left to do.
set -euo pipefail

ports=${1:-31000-31007}
out=${2:-runs/demo}
bin=${VENV:-.venv}/bin
log=$(mktemp -t gen-pipeline-sim.XXXXXX)

"$bin/gen-pipeline" simulate --ports "$ports" --context-length 4096 --health-delay 0 \
    --token-latency 0.002 --max-running 32 >"$log" 2>&1 &
sim=$!
trap 'kill "$sim" 2>/dev/null || true; wait "$sim" 2>/dev/null || true; rm -f "$log"' EXIT

for _ in $(seq 1 300); do
    grep -q "simulator ready" "$log" && break
    kill -0 "$sim" 2>/dev/null || { cat "$log" >&2; echo "demo: simulator failed to start" >&2; exit 1; }
    sleep 0.1
done
grep -q "simulator ready" "$log" || { cat "$log" >&2; echo "demo: simulator not ready" >&2; exit 1; }

echo "demo: simulated fleet on 127.0.0.1:$ports; output in $out"
status=0
"$bin/gen-pipeline" generate --input prompts/sample.jsonl --out "$out" \
    --servers "127.0.0.1:$ports" --max-tokens 256 --progress log || status=$?
echo "demo: generate exited $status; completions in $out/completions.jsonl, ledger in $out/failures.jsonl"
exit "$status"
