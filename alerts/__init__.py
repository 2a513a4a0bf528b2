"""Alert rules on a user's leases and nodes: `gpu_utilization < 5% FOR 30m AND
lease_cost > 50 USD`, evaluated by the worker, firing and resolving recorded, told by
webhook (`alert.fired` / `alert.resolved`) and email (docs/WEBHOOKS.md, "Alert rules")."""
