"""Process-wide settings for the fast tests, made before torch or triton is imported.

- OMP_WAIT_POLICY=PASSIVE: torch's CPU threads otherwise spin while they wait for each
  other, and on a small shared machine (CI's 2 cores) a SmolLM2 decode run took 20x longer.
- TRITON_INTERPRET=1: the kernels run on the CPU through Triton's interpreter; it is read
  when a kernel is decorated, so it must be set before any kernel module is imported.
"""

import os
import sys

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser):
    parser.addoption(
        "--fuzz-long",
        action="store_true",
        help="fuzz every HTTP and gRPC surface with many more cases, from a random seed",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """A long fuzz runs past the per-test timeout of pyproject.toml, on purpose."""
    if config.getoption("--fuzz-long"):
        config.option.timeout = 0


@pytest.fixture
def fuzz_budget(request):
    """The fuzzers' budget: `fuzz_budget(n)` is n cases from a fixed seed (CI), or 50 times
    as many from a random seed with --fuzz-long."""
    from tests.fuzzing.http_fuzz import Budget

    long = request.config.getoption("--fuzz-long")
    return lambda examples: Budget(examples * 50, fixed_seed=False) if long else Budget(examples)


def pytest_terminal_summary(terminalreporter):
    """How many cases each fuzzed operation was sent, for the note and docs/operations.md."""
    fuzzing = sys.modules.get("tests.fuzzing.http_fuzz")
    if fuzzing is not None and fuzzing.CASES:
        terminalreporter.section("fuzzing: cases per operation")
        for key, count in sorted(fuzzing.CASES.items()):
            terminalreporter.write_line(f"{count:8d}  {key}")
