"""dpproxy: a PostgreSQL wire-protocol proxy that answers protected tables only with differentially private aggregates."""
