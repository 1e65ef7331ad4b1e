"""pytest: the app and page scripts run only under Streamlit (they are tested with AppTest in
tests/dashboard), so ``--doctest-modules`` must not import them."""

collect_ignore = ["app.py"]
collect_ignore_glob = ["views/*.py"]
