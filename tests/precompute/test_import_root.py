"""After install, `precompute` is the only name the project puts on a user's import path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FOLDERS = ("models", "jobs", "stores", "flows", "lookup", "bench")


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_design_folder_is_importable_only_under_precompute(folder: str, tmp_path: Path) -> None:
    bare = run_python(f"import {folder}", tmp_path)
    assert bare.returncode == 1
    assert f"ModuleNotFoundError: No module named '{folder}'" in bare.stderr
    rooted = run_python(f"import precompute.{folder}; print(precompute.{folder}.__file__)", tmp_path)
    assert rooted.returncode == 0, rooted.stderr
    assert Path(rooted.stdout.strip()).parent.name == folder  # the folder on disk, as the design names it
