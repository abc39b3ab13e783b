#!/usr/bin/env python3
"""Fetch URLs through the gateway with Python requests.

The gateway is an ordinary forward proxy: requests needs nothing but its
`proxies` setting. The proxy username is the client name, plus
`-session-<id>` to keep one upstream (one exit address) for the session;
the password is the client's discovery token.

    fetch_requests.py --gateway http://gateway:3128 --client crawler-a \
        --token "$TOKEN" --session s81 https://example.com/ ...

Prints one line per URL: the status and the start of the body.
"""

import argparse
import sys
import urllib.parse

import requests


def proxy_url(gateway: str, client: str, token: str, session: str | None) -> str:
    user = client + (f"-session-{session}" if session else "")
    parts = urllib.parse.urlsplit(gateway)
    quote = urllib.parse.quote
    return f"{parts.scheme}://{quote(user, safe='')}:{quote(token, safe='')}@{parts.netloc}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gateway", required=True, help="the gateway's URL, http://HOST:PORT")
    ap.add_argument("--client", required=True, help="the client name of the token")
    ap.add_argument("--token", required=True, help="the client's discovery token")
    ap.add_argument("--session", help="a session id: every request leaves from one address")
    ap.add_argument("--insecure", action="store_true", help="do not verify the targets' certificates")
    ap.add_argument("urls", nargs="+")
    args = ap.parse_args()

    proxy = proxy_url(args.gateway, args.client, args.token, args.session)
    with requests.Session() as s:
        s.proxies = {"http": proxy, "https": proxy}
        failed = 0
        for url in args.urls:
            try:
                # verify per request: a session's own is overridden by
                # REQUESTS_CA_BUNDLE when that is set.
                r = s.get(url, timeout=30, verify=not args.insecure)
            except requests.RequestException as e:
                print(f"error {url}: {e}")
                failed += 1
                continue
            moved = " (session moved)" if r.headers.get("x-gateway-session-moved") else ""
            text = r.content.decode("utf-8", "replace")
            print(f"{r.status_code} {url} {text[:80]!r}{moved}")
            failed += r.status_code >= 400
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
