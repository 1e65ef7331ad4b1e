"""Detectors that see across ranks, hosts and GPUs: stragglers, hangs, hardware faults."""
