"""The PostgreSQL protocol on the client's side: framing, messages, authentication, value encoding."""
