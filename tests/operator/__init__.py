"""Fast tests of the operator's pure cores: spec, render, conditions, metrics, autoscaler."""
