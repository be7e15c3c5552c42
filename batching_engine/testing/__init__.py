"""What the engine's tests and benchmarks both build and drive: tiny random models made on
the spot, and the engine as a real process. Here rather than under tests/ so that a benchmark
imports it as part of the package; the engine itself never imports it. It needs nothing the
`engine` extra does not install (transformers is the reference the tests compare against).
"""
