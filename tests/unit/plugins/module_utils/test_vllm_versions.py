# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/module_utils/vllm/_vllm_versions.py: which vLLM release an executable runs, and whose facts validate it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _vllm_versions as v

SIM = Path(__file__).resolve().parents[3] / "sim"
sys.path.insert(0, str(SIM))
from simvllm.install import install  # noqa: E402


# resolve: on the controller


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0", "0.34.0"])
def test_a_known_release_is_its_own_facts(version):
    assert v.resolve(version) == {"version": version, "facts": version, "warning": None, "problem": None}


def test_a_newer_release_is_validated_against_the_newest_with_a_warning_naming_both():
    found = v.resolve("0.35.0")
    assert found["facts"] == "0.34.0" and found["problem"] is None
    assert found["warning"].startswith("vLLM 0.35.0 is newer than the releases this collection knows (0.32 to 0.34)")
    assert "validated against vLLM 0.34.0's" in found["warning"]
    assert v.resolve("1.0.0rc1")["facts"] == "0.34.0"


def test_another_patch_release_of_a_known_series_takes_its_facts_with_a_warning():
    found = v.resolve("0.33.2")
    assert (
        found["facts"] == "0.33.0" and "vLLM 0.33.2 is validated against the facts of vLLM 0.33.0" in found["warning"]
    )
    assert v.resolve("0.34.0.dev12+g1234abc")["facts"] == "0.34.0"


@pytest.mark.parametrize("version", ["0.31.0", "0.11.2", "0.31.9"])
def test_an_older_release_is_refused_with_the_supported_range(version):
    found = v.resolve(version)
    assert found["facts"] is None and found["warning"] is None
    assert found["problem"].startswith(
        "vLLM %s is older than the releases this collection supports (0.32 to 0.34)" % version
    )


def test_what_is_no_version_is_refused():
    assert v.resolve(None)["problem"] == "the vLLM version None is not a version number"
    assert v.resolve("unknown")["facts"] is None


# read_version: on the host


def test_the_version_is_read_from_the_metadata_beside_the_executable(tmp_path):
    executable = install(str(tmp_path / "venv"), "0.34.0")
    found = v.read_version(executable)
    assert found == {
        "version": "0.34.0",
        "source": str(
            tmp_path
            / "venv"
            / "lib"
            / ("python%d.%d" % sys.version_info[:2])
            / "site-packages"
            / "vllm-0.34.0.dist-info"
            / "METADATA"
        ),
        "error": None,
    }


def test_the_interpreters_environment_comes_first(tmp_path):
    """A console script linked elsewhere (/usr/local/bin/vllm -> ...): pip's shebang names the venv's Python, in
    its plain form or the /bin/sh form pip writes for long paths."""
    install(str(tmp_path / "venv"), "0.32.0")
    python = tmp_path / "venv" / "bin" / "python"
    for index, first_lines in enumerate(
        ("#!%s\n" % python, "#!/bin/sh\n'''exec' \"%s\" \"$0\" \"$@\"\n' '''\n" % python)
    ):
        script = tmp_path / ("vllm%d" % index)
        script.write_text(first_lines + "import sys\n")
        script.chmod(0o755)
        found = v.read_version(str(script))
        assert found["version"] == "0.32.0" and found["source"].startswith(str(tmp_path / "venv")), found


def test_without_metadata_the_executable_is_asked(tmp_path):
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\necho 'INFO 01-01 torch loaded' >&2\necho 0.33.1\n")
    script.chmod(0o755)
    assert v.read_version(str(script)) == {"version": "0.33.1", "source": "%s --version" % script, "error": None}


def test_an_executable_that_does_not_answer_is_cut_short(tmp_path):
    script = tmp_path / "vllm"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    found = v.read_version(str(script), timeout=0.5)
    assert found["version"] is None and found["error"].startswith("%s --version did not answer within 0.5 s" % script)
    assert "no vllm-*.dist-info/METADATA was found in %s" % tmp_path.parent in found["error"]


def test_a_failing_or_missing_executable_says_why(tmp_path):
    script = tmp_path / "vllm"
    script.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named torch' >&2\nexit 1\n")
    script.chmod(0o755)
    found = v.read_version(str(script))
    assert found["version"] is None
    assert found["error"].startswith("%s --version exited 1: ModuleNotFoundError: No module named torch" % script)
    assert v.read_version(str(tmp_path / "absent"))["error"] == "%s is not an executable file" % (tmp_path / "absent")
