"""Domains as plug-ins: what a domain supplies (mem1_core.domains.base.Domain) and the registry
that names them (mem1_core.domains.registry). Callers take `domain_of(cfg)` and never ask which
domain runs."""

from mem1_core.domains.registry import DOMAINS, domain_of, get_domain

__all__ = ["DOMAINS", "domain_of", "get_domain"]
