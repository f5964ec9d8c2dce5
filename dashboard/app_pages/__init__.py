"""Streamlit pages, run by the navigation of streamlit_app.py (not imported)."""
