"""Workloads for speculative decoding (issue 33): chat prompts built from what is installed, no network."""
