"""The ``dpproxy`` command and its subcommands."""
