# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    """How the modules that talk to one vLLM server reach it (argument spec: _http.SERVER_ARGS), and the deadline of each
    request (its default is each module's)."""

    DOCUMENTATION = r"""
options:
  url:
    description:
      - Base URL of the server, for example V(http://127.0.0.1:8000).
      - Requests go through the proxy that C(http_proxy) or C(https_proxy) name, unless C(no_proxy) excludes the
        host. A URL of this host itself (C(localhost), C(127.0.0.0/8), C(::1), C(0.0.0.0), C(::)) never does.
    type: str
    required: true
  api_key:
    description: The server's API key (C(--api-key) or C(VLLM_API_KEY)), sent as a Bearer token.
    type: str
  validate_certs:
    description: Verify TLS certificates for an V(https) O(url).
    type: bool
    default: true
  request_timeout:
    description: >-
      Seconds one HTTP request may take in all (connection, request, status line, headers and body). A server that sends its
      answer slowly fails at this deadline, with the URL and what had not come.
    type: float
"""
