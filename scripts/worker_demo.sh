#!/usr/bin/env bash
# Teaches the `text` demo model a small sentiment task through running workers and
# shows what it learned. Called by run_local.sh; usable against any running cluster:
#   scripts/worker_demo.sh PATH/TO/onlineps_worker_cli WORKER_ENDPOINT [WORKER_ENDPOINT...]
set -euo pipefail
cli=$1; shift
workers=("$@")
train='{"examples": [
 {"text": "a wonderful and moving film", "label": "positive"},
 {"text": "great acting and a lovely story", "label": "positive"},
 {"text": "i loved every minute of it", "label": "positive"},
 {"text": "brilliant funny and warm", "label": "positive"},
 {"text": "an excellent delightful surprise", "label": "positive"},
 {"text": "a boring and painful mess", "label": "negative"},
 {"text": "terrible acting and a dull story", "label": "negative"},
 {"text": "i hated every minute of it", "label": "negative"},
 {"text": "awful tedious and cold", "label": "negative"},
 {"text": "a dreadful disappointing waste", "label": "negative"}]}'
echo "worker_demo: teaching 10 labelled sentences, 30 rounds, spread over ${#workers[@]} worker(s)"
for round in $(seq 30); do
  w=${workers[$((round % ${#workers[@]}))]}
  reply=$("$cli" --worker "$w" learn "$train")
  if [ $((round % 10)) = 0 ] || [ "$round" = 1 ]; then
    loss=$(grep -o '"loss": [0-9.e+-]*' <<<"$reply" | cut -d' ' -f2)
    tau=$(grep -o '"tau": [0-9]*' <<<"$reply" | cut -d' ' -f2)
    echo "worker_demo:   round $round via $w  loss $loss  tau $tau"
  fi
done
w=${workers[0]}
for text in "a lovely warm film" "a dull and tedious waste"; do
  label=$("$cli" --worker "$w" infer "{\"text\": \"$text\"}" | grep -o '"label": "[a-z]*"' | head -1)
  echo "worker_demo: infer \"$text\" -> $label"
done
"$cli" --worker "$w" context_set '{"session": "demo", "items": ["awful dreadful boring"]}' >/dev/null
scores() { tr -d '\n ' | grep -o '"scores":\[[^]]*\]' | cut -d: -f2; }
with=$("$cli" --worker "$w" infer '{"session": "demo", "text": "it was a film"}' | scores)
without=$("$cli" --worker "$w" infer '{"text": "it was a film"}' | scores)
echo "worker_demo: \"it was a film\" scores [negative, positive] without context: $without"
echo "worker_demo:   in session 'demo' (context \"awful dreadful boring\"): $with (other sessions unchanged)"
