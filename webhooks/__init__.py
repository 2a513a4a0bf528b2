"""Signed webhooks: a user's endpoints, the events that matter to them, and their
at-least-once delivery from the worker (docs/WEBHOOKS.md)."""
