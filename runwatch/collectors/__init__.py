"""Collectors: bring points and events in from outside a training process (files, GPUs, hosts)."""
