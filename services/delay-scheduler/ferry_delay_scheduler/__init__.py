"""Delay scheduler: delayed and scheduled delivery and the back-off of consumer retries, kept in a timing wheel over a per-term cache of the brokers' %SCHEDULE%."""
