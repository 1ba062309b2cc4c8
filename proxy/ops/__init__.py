"""Operations: the audit log, Prometheus metrics, the health probe."""
