"""The InferGrid device plugin: a node's GPUs for the kubelet and the extender."""
