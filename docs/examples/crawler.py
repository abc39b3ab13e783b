#!/usr/bin/env python3
"""A crawler that leases its egress proxy from egress-proxies-operator.

It acquires a lease, fetches pages through the leased proxy, renews the
lease at half its TTL, reports each fetch, and releases the lease at the
end. It handles the answers a crawler must expect:

- 409 on acquire (no proxy free, or this client's cap), or 503 (a new
  leader's recovery window after a failover): wait the seconds the
  Retry-After header gives, then ask again;
- every renewal answers a new lease id (it signs the new expiry): use the
  id of the latest answer, the one a new leader takes in after a failover;
- 404 on renew (the lease ended: it expired, was released, or the operator
  lost it): acquire another;
- 409 on renew (the proxy is no longer healthy): release it and acquire
  another.

Plain `requests`, no other dependency:

    python3 crawler.py --api http://operator:8090 --token "$TOKEN" \\
        --url https://example.com/ --pages 10

`--pool NAME` leases only from that ProxyPool (an autoscaled pool at zero
answers 503 `pool_scaling_up` and comes back for it); `--threads N` runs N
such crawlers side by side, each with its own lease.

See docs/api.md for the API.
"""

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import requests


class Api:
    """The discovery and lease API, with the bearer token."""

    def __init__(self, base, token, timeout=10):
        self.base = base.rstrip("/")
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        self.timeout = timeout

    def call(self, method, path, body=None):
        try:
            return self.session.request(
                method, self.base + path, json=body, timeout=self.timeout
            )
        except requests.ConnectionError:
            # A kept-alive connection the API closed while we slept (it
            # closes idle ones after 10 s, as long as some Retry-After
            # waits): once more, on a new connection.
            return self.session.request(
                method, self.base + path, json=body, timeout=self.timeout
            )


def log(*words):
    print(*words, flush=True)


def acquire(api, ttl, filters, deadline):
    """A lease, waiting out 409s as Retry-After says, until `deadline`."""
    body = {"ttlSeconds": ttl}
    if filters:
        body["filters"] = filters
    while True:
        r = api.call("POST", "/v1/leases", body)
        if r.status_code == 201:
            lease = r.json()
            log("leased", lease["id"], "via", where(lease))
            return lease
        if r.status_code in (409, 503):
            wait = int(r.headers.get("Retry-After", "5"))
            code = r.json()["error"]["code"]
            status = r.status_code
            if time.monotonic() + wait > deadline:
                raise SystemExit(f"no lease before the deadline (last: {status} {code})")
            log(f"no lease now ({status} {code}): waiting {wait} s as Retry-After says")
            time.sleep(wait)
            continue
        raise SystemExit(f"acquire failed: {r.status_code} {r.text}")


def renew(api, lease, ttl, filters, deadline):
    """The lease renewed, or another one when it is gone or unhealthy."""
    r = api.call("POST", f"/v1/leases/{lease['id']}/renew", {"ttlSeconds": ttl})
    if r.status_code == 200:
        # The answer carries a fresh id: keep that one from now on.
        renewed = r.json()
        log("renewed", lease["id"], "now", renewed["id"])
        return renewed
    if r.status_code == 404:
        log("lease", lease["id"], "gone (404): acquiring another")
        return acquire(api, ttl, filters, deadline)
    if r.status_code == 409:
        log("proxy of", lease["id"], "unhealthy (409): releasing, acquiring another")
        release(api, lease)
        return acquire(api, ttl, filters, deadline)
    raise SystemExit(f"renew failed: {r.status_code} {r.text}")


def release(api, lease):
    api.call("DELETE", f"/v1/leases/{lease['id']}")
    log("released", lease["id"])


def report(api, lease, result, site):
    body = {"result": result}
    if site:
        body["site"] = site
    r = api.call("POST", f"/v1/leases/{lease['id']}/report", body)
    if r.status_code not in (204, 404):
        log("report refused:", r.status_code, r.text)


def where(lease):
    # Never the URL: it carries the proxy's password.
    return "%s:%s" % (lease["proxy"]["ip"], lease["proxy"]["port"])


def fetch(lease, url, timeout):
    # The URL holds the proxy's credentials (user:password@): requests
    # sends them as Proxy-Authorization, to the proxy only.
    proxy = lease["proxy"]["url"]
    return requests.get(url, proxies={"http": proxy, "https": proxy}, timeout=timeout)


def crawl(a, filters, deadline, site):
    """One crawler: a lease, its pages, the release. Whether every page
    came back."""
    # A session per crawler: requests' sessions are not shared by threads.
    api = Api(a.api, a.token)
    lease = acquire(api, a.ttl, filters, deadline)
    renewed_at = time.monotonic()
    fetched = 0
    try:
        for _ in range(a.pages):
            if time.monotonic() - renewed_at >= a.ttl / 2:
                lease = renew(api, lease, a.ttl, filters, deadline)
                renewed_at = time.monotonic()
            try:
                page = fetch(lease, a.url, timeout=10)
                ok = page.status_code < 400
                log("fetched", a.url, "status", page.status_code, len(page.content), "bytes")
                report(api, lease, "ok" if ok else "blocked", site)
                fetched += ok
            except requests.RequestException as e:
                log("fetch through", where(lease), "failed:", e)
                report(api, lease, "failed", site)
            time.sleep(a.interval)
    finally:
        release(api, lease)
    log(f"done: {fetched} of {a.pages} pages fetched")
    return fetched == a.pages


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--api", required=True, help="discovery API base URL")
    p.add_argument("--token", default="", help="discovery token (DISCOVERY_TOKEN)")
    p.add_argument("--url", required=True, help="the page to fetch")
    p.add_argument("--pages", type=int, default=5, help="fetches to make")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between fetches")
    p.add_argument("--ttl", type=int, default=60, help="lease length in seconds")
    p.add_argument("--attr", action="append", default=[], metavar="KEY=VALUE",
                   help="only proxies with this spec.attributes entry")
    p.add_argument("--pool", default="", help="only proxies of this ProxyPool")
    p.add_argument("--threads", type=int, default=1,
                   help="crawlers side by side, each with its own lease")
    p.add_argument("--deadline", type=float, default=300, help="give up after this many seconds")
    a = p.parse_args(argv)
    filters = {}
    if a.attr:
        filters["attributes"] = dict(kv.split("=", 1) for kv in a.attr)
    if a.pool:
        filters["pool"] = a.pool
    deadline = time.monotonic() + a.deadline
    site = requests.utils.urlparse(a.url).hostname
    if a.threads <= 1:
        return 0 if crawl(a, filters, deadline, site) else 1
    with ThreadPoolExecutor(max_workers=a.threads) as ex:
        done = list(ex.map(lambda _: crawl(a, filters, deadline, site), range(a.threads)))
    log(f"threads: {sum(done)} of {a.threads} fetched every page")
    return 0 if all(done) else 1


if __name__ == "__main__":
    sys.exit(main())
