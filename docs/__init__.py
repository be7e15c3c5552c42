"""Generators of the documentation pages that are derived from the code."""
