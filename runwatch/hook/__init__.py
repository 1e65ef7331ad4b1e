"""The logging hook: ``Run``, its background writer, and the ``logging.Handler``."""
