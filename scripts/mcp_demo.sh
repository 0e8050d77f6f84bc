#!/usr/bin/env bash
# An agent in a shell script: teaches the `text` demo model a small sentiment task
# through the MCP bridge's learn tool (Streamable HTTP, curl) and shows infer change,
# then shows that a session's context changes only that session's predictions.
#   scripts/mcp_demo.sh [MCP_URL]        (default http://127.0.0.1:7400/mcp)
set -euo pipefail
url=${1:-http://127.0.0.1:7400/mcp}
hdr=(-H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream')

# Opens an MCP session; prints its Mcp-Session-Id.
open_session() {
  local id
  id=$(curl -sS -D - -o /dev/null "${hdr[@]}" "$url" -d '{"jsonrpc":"2.0","id":0,"method":"initialize",
    "params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"mcp_demo","version":"1"}}}' |
    tr -d '\r' | awk -F': ' 'tolower($1)=="mcp-session-id"{print $2}')
  [ -n "$id" ] || { echo "mcp_demo: no session from $url (is the bridge running?)" >&2; exit 1; }
  curl -sS "${hdr[@]}" -H "Mcp-Session-Id: $id" -H 'MCP-Protocol-Version: 2025-11-25' "$url" \
    -d '{"jsonrpc":"2.0","method":"notifications/initialized"}' >/dev/null
  echo "$id"
}

# call SESSION TOOL ARGUMENTS_JSON: prints the tool's structuredContent (or its error).
call() {
  curl -sS "${hdr[@]}" -H "Mcp-Session-Id: $1" -H 'MCP-Protocol-Version: 2025-11-25' "$url" \
    -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"$2\",\"arguments\":$3}}" |
    python3 -c 'import json,sys; r=json.load(sys.stdin)
if "error" in r: print("error:", r["error"]["message"]); sys.exit(1)
r=r["result"]
print(r["content"][0]["text"] if r.get("isError") else json.dumps(r["structuredContent"]))'
}

field() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print($1)" "$2"; }

train='[{"text": "a wonderful and moving film", "label": "positive"},
 {"text": "great acting and a lovely story", "label": "positive"},
 {"text": "i loved every minute of it", "label": "positive"},
 {"text": "brilliant funny and warm", "label": "positive"},
 {"text": "an excellent delightful surprise", "label": "positive"},
 {"text": "a boring and painful mess", "label": "negative"},
 {"text": "terrible acting and a dull story", "label": "negative"},
 {"text": "i hated every minute of it", "label": "negative"},
 {"text": "awful tedious and cold", "label": "negative"},
 {"text": "a dreadful disappointing waste", "label": "negative"}]'
probe='{"text": "a lovely warm film"}'

agent=$(open_session)
before=$(call "$agent" infer "$probe")
echo "mcp_demo: before learning, infer \"a lovely warm film\" -> $(field 'd["label"]' "$before") $(field '{k: round(v, 3) for k, v in d["scores"].items()}' "$before")"
for round in $(seq 40); do
  out=$(call "$agent" learn "{\"examples\": $train}")
  if [ $((round % 10)) = 0 ]; then
    echo "mcp_demo:   learn round $round: loss $(field 'round(d["loss"],3)' "$out") version $(field 'd["model_version"]' "$out") staleness $(field 'd["staleness"]' "$out") ($(field 'd["outcome"]' "$out"))"
  fi
done
after=$(call "$agent" infer "$probe")
echo "mcp_demo: after learning,  infer \"a lovely warm film\" -> $(field 'd["label"]' "$after") $(field '{k: round(v, 3) for k, v in d["scores"].items()}' "$after")"
neg=$(call "$agent" infer '{"text": "a dull and tedious waste"}')
echo "mcp_demo:                  infer \"a dull and tedious waste\" -> $(field 'd["label"]' "$neg")"

other=$(open_session)
call "$agent" set_context '{"items": ["awful dreadful boring"]}' >/dev/null
with=$(call "$agent" infer "$probe")
without=$(call "$other" infer "$probe")
echo "mcp_demo: session A with context \"awful dreadful boring\": $(field '{k: round(v, 3) for k, v in d["scores"].items()}' "$with")"
echo "mcp_demo: session B, no context:                        $(field '{k: round(v, 3) for k, v in d["scores"].items()}' "$without") (context never enters the shared model)"
info=$(call "$agent" model_info '{}')
echo "mcp_demo: model_info: version $(field 'd["model_version"]' "$info"), staleness $(field 'd["staleness"]' "$info"), workers $(field '[(w["endpoint"], w["sessions"]) for w in d["workers"]]' "$info")"
