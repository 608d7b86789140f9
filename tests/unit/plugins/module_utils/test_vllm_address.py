# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/module_utils/vllm/_vllm_address.py: where a server is reached from its own host."""

from __future__ import annotations

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _vllm_address


def test_local_url():
    assert _vllm_address.local_url("0.0.0.0", 1) == "http://127.0.0.1:1"
    assert _vllm_address.local_url("::", 2) == "http://[::1]:2"
    assert _vllm_address.local_url("10.0.0.5", 3) == "http://10.0.0.5:3"
    assert _vllm_address.local_url(None, 4) == "http://127.0.0.1:4"
    assert _vllm_address.local_url("fe80::1", 5) == "http://[fe80::1]:5"


def test_local_host():
    assert _vllm_address.local_host("") == "127.0.0.1"
    assert _vllm_address.local_host("::") == "::1"
    assert _vllm_address.local_host("192.0.2.7") == "192.0.2.7"
