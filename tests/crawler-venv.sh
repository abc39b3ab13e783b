#!/usr/bin/env bash
# The crawler clients the gateway's tests run (docs/examples/gateway/):
# Scrapy and Playwright's Python package, from PyPI, in a venv kept with
# cargo's target (a cache: made once, reused while its versions stand).
# The browser Playwright drives is Debian's chromium, never a download.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CRAWLER_VENV:-${CARGO_TARGET_DIR:-target}/crawler-venv}
WANT='scrapy>=2.11,<3 playwright>=1.50,<2'
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.wanted" 2>/dev/null)" = "$WANT" ]; then
  exit 0
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
# shellcheck disable=SC2086
"$VENV/bin/pip" install -q $WANT
echo "$WANT" > "$VENV/.wanted"
