"""ferry-dedup: Redis claims and ledger look-ups over HTTP, and reconciliation of the ledger."""
