"""The `runwatch demo` run: a seeded, realistic training run with real faults."""
