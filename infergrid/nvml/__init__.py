"""The hardware seam: NVML behind one Protocol, with a real backend and a fleet-fed fake.

Everything above this package (discovery, health, the servicers) talks to an
``NvmlBackend`` and never to pynvml, so it runs and is tested without a GPU.
"""
