"""Consuming: the Consumer, its fetchers, positions and rebalance, retries (send-back), the push-style runner, ordered queues and their locks."""
