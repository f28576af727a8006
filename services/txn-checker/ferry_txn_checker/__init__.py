"""Transaction checker: resolves transactional half messages left undecided by asking a live producer of the group (check-back), and rolls back after the check limit."""
