"""Benchmarks behind `venusrl bench`: each writes one JSON object of named figures."""
