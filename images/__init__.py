"""The component images, built on this machine without a container registry.

`python -m images.build` (`make images`) builds every image into one OCI layout in the
cache; `images.containerd_load.load` imports them into a containerd. images/README.md
tells how.
"""
