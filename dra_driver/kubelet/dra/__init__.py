"""The kubelet's DRA plugin API."""
