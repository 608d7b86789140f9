# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where a vLLM server is reached from its own host: the one loopback rule of the host's reads and the role's plan,
and whether a URL names this host itself (the HTTP client sends such a URL past any proxy).

Apart from _vllm_host, so that the controller's plan (plugins/plugin_utils/_vllm_plan.py) does not import the host's
HTTP client: every task that uses a filter of the collection imports every filter file and what it imports
(docs/architecture.md, "Filters").
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def local_host(host: str | None) -> str:
    """The address a check on the host itself uses for a server bound to `host`: loopback for the wildcard addresses."""
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host or "", host or "")


def local_url(host: str | None, port: int | str | None) -> str:
    """The URL of local_host(host) and `port`, with brackets for an IPv6 literal."""
    address = local_host(host)
    return "http://%s:%s" % ("[%s]" % address if ":" in address else address, port)


def is_loopback(url: str) -> bool:
    """Whether `url` names this host itself: localhost, 127.0.0.0/8, ::1 (also IPv4-mapped), or the unspecified
    address 0.0.0.0 or :: that vLLM prints when it binds to all addresses (a connection to it reaches this host)."""
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified
