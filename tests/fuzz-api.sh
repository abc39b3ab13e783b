#!/usr/bin/env bash
# Fuzzes the discovery/lease API from its own OpenAPI document with
# schemathesis (PyPI), bounded: 50 examples per operation, 120 s at most.
# The server is an ignored test binary serving on 127.0.0.1 that also stops
# by itself. Needs python3 with venv; installs schemathesis into a venv.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
VENV=${FUZZ_VENV:-${CARGO_TARGET_DIR:-target}/fuzz-venv}
PORT=${FUZZ_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
ADDR=127.0.0.1:$PORT
TOKEN=fuzz-token-$RANDOM$RANDOM

if [ ! -x "$VENV/bin/st" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q 'schemathesis>=4,<5'
fi

# Run the test binary itself (not through cargo) so the trap below ends
# the very process that serves.
bin=$($CARGO test --test fuzz_server --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*fuzz_server-[^)]*\)).*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "fuzz_server test binary not found" >&2; exit 1; }
FUZZ_ADDR=$ADDR FUZZ_SECS=180 FUZZ_TOKEN=$TOKEN "$bin" --ignored --nocapture >/dev/null 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT

for _ in $(seq 1 100); do
  if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$PORT),0.2)" 2>/dev/null; then break; fi
  sleep 0.2
done

"$VENV/bin/st" run "http://$ADDR/openapi.json" \
  --header "Authorization: Bearer $TOKEN" \
  --checks all \
  --max-examples 50 \
  --max-time 120 \
  --request-timeout 5 \
  --seed 1 \
  --warnings off
