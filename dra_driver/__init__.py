"""InferGrid's DRA driver: a kubelet DRA plugin for the node's GPUs (real or fake NVML).

It publishes the GPUs, MIG instances and shareable GPUs as ResourceSlices of driver
gpu.infergrid.io (slices.py, publisher.py), registers with the kubelet's plugin watcher and
prepares allocated claims by writing CDI specs (plugin.py, claims.py, prepare.py, cdi.py).
The names every reader agrees on are in infergrid/dra.py.
"""
