"""Process-wide settings for the fast tests, made before torch or triton is imported.

- OMP_WAIT_POLICY=PASSIVE: torch's CPU threads otherwise spin while they wait for each
  other, and on a small shared machine (CI's 2 cores) a SmolLM2 decode run took 20x longer.
- TRITON_INTERPRET=1: the kernels run on the CPU through Triton's interpreter; it is read
  when a kernel is decorated, so it must be set before any kernel module is imported.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TRITON_INTERPRET", "1")
