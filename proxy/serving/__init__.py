"""Listening, one session per client, one statement at a time: where a statement is judged and answered."""
