"""`manage.py` with a configuration the settings refuse says so in one line (exit 1),
not with a 55-line traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_a_refused_setting_is_one_line_naming_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "SECRET_KEY_FILE")}
    env.update(DEBUG="0", GPUMARKET_VAR_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "manage.py", "check", "--deploy"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "manage.py: the configuration is not usable: SECRET_KEY (or SECRET_KEY_FILE) is "
        "required when DEBUG is off"], done.stderr
