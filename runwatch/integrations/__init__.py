"""Integrations with the tools people already log through: each module imports its
framework only when used (extras ``runwatch[hf]``, ``runwatch[lightning]``)."""
