"""The kubelet's plugin registration API, read by its plugin watcher."""
