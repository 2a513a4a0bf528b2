"""`python -m providers.runner …` runs the gpumarket-runner CLI."""

import sys

from .cli import main

sys.exit(main())
