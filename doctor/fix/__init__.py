"""dsenv doctor --fix: the actions checks propose, their fixers, and the command that applies them."""
