"""The InferGrid scheduler extender: kube-scheduler calls it to filter, score and bind GPU pods."""
