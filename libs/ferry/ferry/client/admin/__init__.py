"""Admin and queries: the Admin client, dead-letter queues, message queries and a message's trace read back."""
