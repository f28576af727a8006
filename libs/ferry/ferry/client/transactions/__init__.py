"""Transactions: the TransactionProducer, its check-back responder and the txn-checker's HTTP client."""
