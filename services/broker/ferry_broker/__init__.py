"""Broker: stores and serves messages (send, long-polling pull, consumer offsets, queue locks, message query, master/slave replication) on its log store directory."""
