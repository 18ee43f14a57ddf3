#!/usr/bin/env bash
# The first job from a photo: send a PNG (or JPEG) of a handwritten digit to the
# `digit-photo` pipeline (decoded by code, classified, answered by code), poll the
# job until it has finished, and print the digit and how sure the model is.
#
# Needs: curl, base64 and python3, and `make run` running.
# Reads: INFERENCE_URL (default http://127.0.0.1:8000) and INFERENCE_API_KEY.
# Usage: bash examples/photo_job.sh [photo.png]   (default: the bundled seven)
set -euo pipefail
: "${INFERENCE_URL:=http://127.0.0.1:8000}"
: "${INFERENCE_API_KEY:?export INFERENCE_API_KEY=ik_... (the key make run printed)}"
AUTH="Authorization: Bearer $INFERENCE_API_KEY"
PHOTO="${1:-$(dirname "$0")/../models/digit-decode/1/seven.png}"

# 1. Submit: the photo's bytes as {"b64": ...} in JSON.
IMAGE=$(base64 < "$PHOTO" | tr -d '\n')
JOB=$(curl -sS --fail-with-body -X POST "$INFERENCE_URL/jobs" \
  -H "$AUTH" -H "Content-Type: application/json" \
  -d "{\"model\": \"digit-photo\", \"inputs\": {\"image\": [{\"b64\": \"$IMAGE\"}]}}")
JOB_ID=$(printf '%s' "$JOB" | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')
echo "job: $JOB_ID"

# 2. Poll until it has finished.
while :; do
  RESULT=$(curl -sS --fail-with-body "$INFERENCE_URL/jobs/$JOB_ID" -H "$AUTH")
  STATUS=$(printf '%s' "$RESULT" | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])')
  case "$STATUS" in queued|running) sleep 0.2 ;; *) break ;; esac
done
echo "status: $STATUS"
[ "$STATUS" = succeeded ] || { printf '%s\n' "$RESULT" >&2; exit 1; }

# 3. The answer: the digit and the probability the model gave it.
printf '%s' "$RESULT" | python3 -c '
import json, sys
outputs = json.load(sys.stdin)["outputs"]
print("digit:", outputs["digit"][0], "confidence: %.4f" % outputs["confidence"][0])'
