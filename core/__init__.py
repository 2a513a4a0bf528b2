"""Plumbing shared by every app, with no domain logic: strict API fields, text checks,
pagination, bulk inserts, the strict admin. Imports nothing of the project."""
