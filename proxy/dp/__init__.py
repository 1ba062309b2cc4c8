"""A DP plan to a charged, noised answer: constants folded, buckets narrowed, the budget charged, columns released."""
