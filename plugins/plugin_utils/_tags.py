# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The roles' tags are prefixed with the role's name (reset_gpus_stop, vllm_server_start): bare words such as `stop`
collide when a play uses both roles. For one release a bare tag of before is refused with its new name, by the
reset_gpus role (filter renamed_tags, plugins/filter/inputs.py) and the vllm_server role (_vllm_run.phases)."""

from __future__ import annotations

from typing import List, Optional, Sequence


def renamed(
    run_tags: Optional[Sequence[str]], skip_tags: Optional[Sequence[str]], role: str, bare: Sequence[str]
) -> str:
    """Why the tags of a run are refused for `role`, whose tags were the bare phase names `bare` ("" when they are
    not): each of them given to --tags or --skip-tags, with its name now."""
    given: List[str] = []
    for tag in list(run_tags or []) + list(skip_tags or []):
        if tag in bare and tag not in given:
            given.append(tag)
    if not given:
        return ""
    return "the tags of %s are prefixed with its name now (%s): %s" % (
        role,
        ", ".join("%s_%s" % (role, tag) for tag in bare),
        "; ".join("tag %s is %s_%s" % (tag, role, tag) for tag in given),
    )
