"""Producing: the Producer, its Sender (batching, retries, failover) and Lanes, the batch items and their encoding, queue choice, delayed-message cancel."""
