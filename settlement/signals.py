"""Signals of the ledger's set-based writes, which send no post_save per row.

`entries_written` (sender JournalEntry, `entry_ids`: the new entries' ids, a list of
ints): sent inside the writing transaction by settlement.bulk's row-based batches (a
metering run writes 1,000 entries a transaction); the live feed (frontend/signals.py)
notes them as it notes a saved JournalEntry.
"""

from __future__ import annotations

from django.dispatch import Signal

entries_written = Signal()
