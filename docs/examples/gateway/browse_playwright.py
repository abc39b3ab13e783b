#!/usr/bin/env python3
"""Load a page through the gateway in a real headless Chromium.

Playwright answers the gateway's 407 with the proxy credentials; the
browser is Debian's (`apt-get install chromium`), not a downloaded one.

    browse_playwright.py --gateway http://gateway:3128 --client crawler-a \
        --token "$TOKEN" --session s81 https://example.com/

Prints the page's text. Chromium drops a navigation when the host's
network interfaces change (net::ERR_NETWORK_CHANGED, common on busy
hosts and in containers, where interfaces come and go in bursts); such a
load is tried again after a pause that grows by a second each time, at
most five times in all.
"""

import argparse
import sys
import time

from playwright.sync_api import Error, sync_playwright

ATTEMPTS = 5


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--client", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--session")
    ap.add_argument("--chromium", default="/usr/bin/chromium", help="the browser to drive")
    ap.add_argument("--insecure", action="store_true", help="accept any certificate")
    ap.add_argument("url")
    args = ap.parse_args()
    user = args.client + (f"-session-{args.session}" if args.session else "")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=args.chromium,
            proxy={"server": args.gateway, "username": user, "password": args.token},
        )
        try:
            page = browser.new_page(ignore_https_errors=args.insecure)
            response = goto(page, args.url)
            print(page.inner_text("body"))
            return 0 if response is not None and response.ok else 1
        finally:
            browser.close()


def goto(page, url):
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return page.goto(url, timeout=30_000)
        except Error as err:
            if "ERR_NETWORK_CHANGED" not in str(err) or attempt == ATTEMPTS:
                raise
            print(f"network changed, loading again in {attempt} s ({attempt}/{ATTEMPTS})", file=sys.stderr)
            time.sleep(attempt)
    return None


if __name__ == "__main__":
    sys.exit(main())
