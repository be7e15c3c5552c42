"""The batching engine: the server inside every inference pod."""
