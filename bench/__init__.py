"""Benchmarks, each printing a table (or --json) measured in one run.

Run each as a module from the repository root, `python -m bench.<name>`: the current
directory is then on the import path, so a benchmark reaches its siblings (`bench.*`) and the
local-cluster harness (`e2e.*`) as well as the project's packages, with or without an install
of the project. Those that import only the project's packages also run as `python bench/<name>.py`
where the project is installed.
"""
