"""`gpumarket`: the buyer's command line for a gpumarket marketplace (docs/CLI.md).

Talks to the public REST API and the `/ws/me/` feed only; imports no Django and nothing
of the server's packages (tests/test_import_graph.py)."""

__version__ = "0.1.0"
