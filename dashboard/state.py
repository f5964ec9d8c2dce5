"""The shared sidebar's selection, as the pages read it (``streamlit_app.py`` sets it)."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from tritonwatch.dashboard.loaders import Settings


@dataclass(frozen=True)
class Selection:
    settings: Settings
    start: float
    end: float
    step: float  # chart bucket width for this range (loaders.step_for)
    target: str | None
    model: str | None
    version: str | None

    @property
    def url(self) -> str:
        return self.settings.store_url

    @property
    def span(self) -> float:
        return self.end - self.start


KEY = "tw_selection"


def current() -> Selection:
    """The selection of this run (set by streamlit_app.py before the page runs)."""
    selection = st.session_state.get(KEY)
    if not isinstance(selection, Selection):
        raise RuntimeError("run the dashboard through streamlit_app.py")
    return selection
