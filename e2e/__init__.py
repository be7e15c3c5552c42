"""End-to-end tests on a real Kubernetes API server."""
