"""The registry of domains: one line per domain, its name (`env.kind`) -> where its Domain class
lives (`module:Class`, imported only when that domain runs: mem1_core.domains.registry).

Like gymnasium's `register(id=..., entry_point="pkg.module:Class")`. It lives beside the config
because the config validates `env.kind` against it and imports nothing above itself; adding a
domain is its own package plus one line here.
"""

DOMAINS: dict[str, str] = {
    "qa": "mem1_core.qa.domain:QADomain",
    "webshop": "mem1_core.webshop.domain:WebShopDomain",
    "websearch": "mem1_core.websearch.domain:WebSearchDomain",
}
