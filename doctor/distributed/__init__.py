"""dsenv doctor --distributed: launch every rank, meet, all-reduce, time host pairs, report."""
