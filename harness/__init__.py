"""What the engine's tests and benchmarks both build and drive: tiny random models made on
the spot, the engine as a real process, and a simulated GPU (with the runner's budget code
started on it) that several processes can share. A package of the repository, not of the
distribution: tests and `python -m bench.<name>` import it from the repository root, and no
image ships it (the runtime images carry no test-only code). It needs nothing the `engine`
extra does not install (transformers is the reference the tests compare against).
"""
