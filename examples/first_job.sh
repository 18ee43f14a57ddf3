#!/usr/bin/env bash
# The first job: submit an 8x8 image of a handwritten digit to the `digits` model,
# poll the job until it has finished, and print the prediction (`digit: 0`).
#
# Needs: curl and python3 (for reading JSON), and `make run` running.
# Reads: INFERENCE_URL (default http://127.0.0.1:8000) and INFERENCE_API_KEY,
#        both printed by `make run` as lines to paste.
set -euo pipefail
: "${INFERENCE_URL:=http://127.0.0.1:8000}"
: "${INFERENCE_API_KEY:?export INFERENCE_API_KEY=ik_... (the key make run printed)}"
AUTH="Authorization: Bearer $INFERENCE_API_KEY"

# 1. Submit: 202 Accepted at once, with the job's id (and a Location header).
JOB=$(curl -sS --fail-with-body -X POST "$INFERENCE_URL/jobs" \
  -H "$AUTH" -H "Content-Type: application/json" \
  -d '{"model": "digits", "inputs": {"pixels": [[0,0,5,13,9,1,0,0,0,0,13,15,10,15,5,0,0,3,15,2,0,11,8,0,0,4,12,0,0,8,8,0,0,5,8,0,0,9,8,0,0,4,11,0,1,12,7,0,0,2,14,5,10,12,0,0,0,0,6,13,10,0,0,0]]}}')
JOB_ID=$(printf '%s' "$JOB" | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')
echo "job: $JOB_ID"

# 2. Poll until the status is succeeded (or failed, cancelled, expired).
while :; do
  RESULT=$(curl -sS --fail-with-body "$INFERENCE_URL/jobs/$JOB_ID" -H "$AUTH")
  STATUS=$(printf '%s' "$RESULT" | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])')
  case "$STATUS" in queued|running) sleep 0.2 ;; *) break ;; esac
done
echo "status: $STATUS"
[ "$STATUS" = succeeded ] || { printf '%s\n' "$RESULT" >&2; exit 1; }

# 3. The prediction: the digit (outputs.probabilities holds each class's probability).
printf '%s' "$RESULT" | python3 -c 'import json, sys; print("digit:", json.load(sys.stdin)["outputs"]["label"][0])'
