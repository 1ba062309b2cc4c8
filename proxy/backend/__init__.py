"""Connections to the backing PostgreSQL, and checks of the policy against its schema and statistics."""
