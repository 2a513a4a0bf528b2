"""`python -m buyer_cli` = `gpumarket`."""

import sys

from .cli import main

sys.exit(main())
