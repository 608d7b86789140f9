"""Run a module's main() in this process, as the unit tests of plugins/modules do."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args


def run_main(module, capsys, args):
    """module.main() with `args` (a dict of module options, _ansible_check_mode and the like too); return (exit code,
    the result dict it printed)."""
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exited:
            module.main()
    return exited.value.code, json.loads(capsys.readouterr().out)
