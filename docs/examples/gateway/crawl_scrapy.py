#!/usr/bin/env python3
"""Crawl a site through the gateway with Scrapy, one sticky session.

Scrapy's HttpProxyMiddleware takes the credentials from the proxy URL
(`request.meta["proxy"]`) and sends them as Proxy-Authorization. Every
request of the crawl carries the same session, so the whole crawl leaves
from one address.

    crawl_scrapy.py --gateway http://gateway:3128 --client crawler-a \
        --token "$TOKEN" --session s81 --start http://example.com/

Prints one JSON line per page: {"url": ..., "text": ...}.
"""

import argparse
import json
import sys
import urllib.parse

import scrapy
from scrapy.crawler import CrawlerProcess


class SiteSpider(scrapy.Spider):
    name = "site"

    def __init__(self, start: str, proxy: str, **kw):
        super().__init__(**kw)
        self.first = start
        self.proxy = proxy
        self.allowed = urllib.parse.urlsplit(start).netloc

    # Every request names the proxy, the first one too: Scrapy 2.13 and
    # later start from start() (start_urls there would go direct), older
    # ones from start_requests().
    async def start(self):
        yield scrapy.Request(self.first, meta={"proxy": self.proxy})

    def start_requests(self):
        yield scrapy.Request(self.first, meta={"proxy": self.proxy})

    def parse(self, response):
        text = " ".join(response.css("p::text").getall()).strip()
        print(json.dumps({"url": response.url, "text": text}), flush=True)
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href)
            if urllib.parse.urlsplit(url).netloc == self.allowed:
                yield scrapy.Request(url, meta={"proxy": self.proxy})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--client", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--session", required=True)
    ap.add_argument("--start", required=True, help="the first page")
    args = ap.parse_args()
    user = f"{args.client}-session-{args.session}"
    parts = urllib.parse.urlsplit(args.gateway)
    q = urllib.parse.quote
    proxy = f"{parts.scheme}://{q(user, safe='')}:{q(args.token, safe='')}@{parts.netloc}"
    process = CrawlerProcess(
        settings={
            "LOG_LEVEL": "WARNING",
            "ROBOTSTXT_OBEY": False,
            "RETRY_ENABLED": False,
            "CONCURRENT_REQUESTS": 4,
            "TELNETCONSOLE_ENABLED": False,
        }
    )
    crawler = process.create_crawler(SiteSpider)
    process.crawl(crawler, start=args.start, proxy=proxy)
    process.start()
    stats = crawler.stats.get_stats()
    errors = stats.get("log_count/ERROR", 0) + stats.get("downloader/exception_count", 0)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
