"""Make ``import marketplace`` resolve to the project package, not to ``tests/marketplace``.

pytest's rootdir-based import mode puts ``tests/`` on ``sys.path`` (for
``tests/conftest.py``); when the repository root is not also in front of it (plain
``pytest`` without pytest-django's manage.py discovery), the directory
``tests/marketplace`` would be imported as a namespace package named ``marketplace``
and shadow the real one. This directory therefore has no ``__init__.py`` and its test
modules carry unique ``test_engine_*`` names.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[3])

if sys.path[:1] != [_ROOT]:
    sys.path.insert(0, _ROOT)
_mod = sys.modules.get("marketplace")
if _mod is not None and getattr(_mod, "__file__", None) is None:  # a namespace shadow
    for _name in [n for n in sys.modules if n == "marketplace" or n.startswith("marketplace.")]:
        del sys.modules[_name]
