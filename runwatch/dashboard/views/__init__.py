"""The dashboard's pages: Streamlit scripts, one per page, run by the router (app.py)."""
