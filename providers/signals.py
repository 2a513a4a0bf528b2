"""Signals the providers app sends; the market listens (marketplace/apps.py), so that
providers never imports marketplace."""

from django.dispatch import Signal

# Sent after a heartbeat changed the health of GPUs of `node` (kwargs: node, unhealthy:
# list of GPU UUIDs that turned unhealthy, recovered: list that turned healthy again).
gpu_health_changed = Signal()

# Sent after an inventory changed which units of `node` are listed (a MIG layout
# changed: slices replaced, or a GPU listed whole instead of as slices; kwargs: node).
units_changed = Signal()
# Sent after an inventory changed the CUDA version `node` reports (kwargs: node, old, new):
# the market's cached order books hold each ask's node CUDA version (docs/MATCHING.md).
node_cuda_changed = Signal()
# Sent after a heartbeat announced another runtime for `node` than before (kwargs: node,
# old, new; "docker" | "process"): the cached order books hold whether each ask's node runs
# images (marketplace/runtimes.py).
node_runtime_changed = Signal()
