"""Idempotence service: a fast Redis claim (weak check) and the ledger table (strong check), with reconciliation of the ledger."""
