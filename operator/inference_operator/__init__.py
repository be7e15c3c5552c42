"""The InferGrid operator: InferenceService objects served by engine pods, scaled by SLOs.

Pure cores (`spec`, `render`, `conditions`, `autoscaler`, `metrics_scrape`'s
parsing) decide everything; `handlers` and `main` only talk to the API server
and the engines.
"""
