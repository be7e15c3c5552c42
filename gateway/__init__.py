"""The InferGrid gateway: one OpenAI endpoint in front of every InferenceService's engines."""
