"""The engine's HTTP edge: OpenAI-style request parsing and the aiohttp app."""
