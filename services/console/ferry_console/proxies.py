"""What the console believes about a request that came through a reverse proxy.

Behind a TLS-terminating proxy the console sees plain HTTP from the proxy's
address: it cannot tell on its own that the browser used HTTPS (so the
session cookie would lose `Secure`), nor who the browser is (so every login
would count against the proxy's address). `X-Forwarded-Proto` and
`X-Forwarded-For` say so, but anyone can send them: the console believes them
only from the addresses in `FERRY_CONSOLE_TRUSTED_PROXIES` (IPs or CIDRs,
comma-separated; empty: no proxy is trusted, the headers are ignored).

`FERRY_CONSOLE_COOKIE_SECURE`: `auto` (default) sets `Secure` when the
request is HTTPS, directly or as a trusted proxy says; `on` always (a console
only ever reached through an HTTPS proxy); `off` never (plain-HTTP testing).
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from aiohttp import web

COOKIE_SECURE_MODES = ("auto", "on", "off")
#: A client address is counted by its /64 for IPv6: one host holds a whole /64.
IPV6_CLIENT_PREFIX = 64
#: X-Forwarded-For entries looked at, from the right (a bound on a header anyone can grow).
MAX_FORWARDED_HOPS = 16

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def parse_networks(raw: str, what: str = "trusted_proxies") -> tuple[Network, ...]:
    """`a.b.c.d, 10.0.0.0/8, ::1` as networks; ValueError naming the bad entry."""
    networks = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{what}: {item!r} is not an IP address or CIDR") from None
    return tuple(networks)


class ProxyView:
    """The request as the browser made it: its client address and whether it was HTTPS."""

    def __init__(self, trusted: Iterable[Network] = (), cookie_secure: str = "auto") -> None:
        if cookie_secure not in COOKIE_SECURE_MODES:
            raise ValueError(f"cookie_secure must be one of {', '.join(COOKIE_SECURE_MODES)}, "
                             f"not {cookie_secure!r}")
        self.trusted = tuple(trusted)
        self.cookie_secure = cookie_secure

    def _is_trusted(self, text: str | None) -> bool:
        ip = _ip(text) if text else None
        return ip is not None and any(ip in net for net in self.trusted)

    def client_address(self, request: web.Request) -> str:
        """Who sent the request: its peer, or, from a trusted proxy, the nearest address
        in X-Forwarded-For that is not a trusted proxy. IPv6 as its /64."""
        address = request.remote or ""
        if self._is_trusted(address):
            hops = request.headers.get("X-Forwarded-For", "").split(",")[-MAX_FORWARDED_HOPS:]
            for hop in reversed(hops):
                if _ip(hop) is None:
                    break   # garbage: stop believing the header here
                address = hop.strip()
                if not self._is_trusted(address):
                    break
        ip = _ip(address)
        if ip is None:
            return address
        if isinstance(ip, ipaddress.IPv6Address):
            if ip.ipv4_mapped is not None:
                return str(ip.ipv4_mapped)
            return str(ipaddress.ip_network(f"{ip}/{IPV6_CLIENT_PREFIX}", strict=False))
        return str(ip)

    def https(self, request: web.Request) -> bool:
        """Whether the browser's request was HTTPS (a trusted proxy's X-Forwarded-Proto)."""
        if request.secure:
            return True
        if not self._is_trusted(request.remote):
            return False
        # the value the nearest (trusted) proxy set: a proxy overwrites or appends it
        proto = request.headers.get("X-Forwarded-Proto", "").split(",")[-1]
        return proto.strip().lower() == "https"

    def secure_cookie(self, request: web.Request) -> bool:
        """Whether the session cookie gets `Secure` (FERRY_CONSOLE_COOKIE_SECURE)."""
        if self.cookie_secure == "auto":
            return self.https(request)
        return self.cookie_secure == "on"
