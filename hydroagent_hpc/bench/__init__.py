"""Benchmarks (``make bench``): speed and memory as ratios against named baselines measured in the same run."""
