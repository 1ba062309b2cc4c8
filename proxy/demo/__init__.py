"""``dpproxy demo`` and ``dpproxy demo-load``: the Adult-shaped data, its policy, an embedded PostgreSQL."""
