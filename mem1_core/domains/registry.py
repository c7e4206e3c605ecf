"""The domain a run's config selects: the registry's entry (mem1_core.config.domains, one line
per domain) imported when that domain runs, so that no caller asks which domain it is."""

from __future__ import annotations

from functools import cache
from importlib import import_module

from mem1_core.config.domains import DOMAINS


@cache
def get_domain(name: str):
    """The Domain registered under `name` (one instance per process)."""
    if name not in DOMAINS:
        raise ValueError(f"env.kind={name!r}: no such domain; the domains are {sorted(DOMAINS)}")
    module, _, cls = DOMAINS[name].partition(":")
    return getattr(import_module(module), cls)()


def domain_of(cfg):
    """The Domain a run's config selects (`env.kind`), the config checked against it."""
    domain = get_domain(cfg.env.kind)
    domain.check(cfg)
    return domain
