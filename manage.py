#!/usr/bin/env python
"""Django's command-line utility for gpumarket."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:  # a setting from the environment: say which, once
        sys.exit(f"manage.py: the configuration is not usable: {exc}")


if __name__ == "__main__":
    main()
