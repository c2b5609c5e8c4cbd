"""Output kinds: the contract, and a kind of a test's own that runs through every part that uses it."""
