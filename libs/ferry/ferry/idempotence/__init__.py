"""ferry.idempotence."""
