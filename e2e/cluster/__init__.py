"""The local Kubernetes cluster the e2e suite runs against."""
