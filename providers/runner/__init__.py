"""gpumarket-runner: the provider-side agent that starts leased GPU containers.

It imports nothing from the marketplace (no Django); it talks to it over HTTP only,
as docs/RUNNER_PROTOCOL.md describes.
"""

__version__ = "0.1.0"
