"""Entry point of ``tritonwatch dashboard``: the navigation and the shared sidebar.

Pages (``app_pages/``) only lay out the UI; every read goes through ``loaders``.  The sidebar
sets one :class:`state.Selection` per run: time range (15 min to 30 days, or custom dates),
target, model, version, auto-refresh.  ``?target=&model=`` in the URL (the fleet's links)
preselects them.
"""

from __future__ import annotations

import time as _clock
from datetime import UTC, date, datetime, time, timedelta

import streamlit as st

from tritonwatch.dashboard import loaders, slo_loaders
from tritonwatch.dashboard.state import KEY, Selection
from tritonwatch.store import StoreError

RANGES = {"15 min": 900.0, "1 h": 3600.0, "6 h": 6 * 3600.0, "24 h": 86400.0,
          "7 d": 7 * 86400.0, "30 d": 30 * 86400.0, "custom": 0.0}
REFRESH = {"off": None, "10 s": 10.0, "30 s": 30.0, "1 min": 60.0}
ALL = "(all)"

st.set_page_config(page_title="Tritonwatch", layout="wide")

PAGES = [
    st.Page("app_pages/fleet.py", title="Fleet", url_path="fleet", default=True),
    st.Page("app_pages/model.py", title="Model", url_path="model"),
    st.Page("app_pages/llm.py", title="LLM serving", url_path="llm"),
    st.Page("app_pages/gpus.py", title="GPUs", url_path="gpus"),
    st.Page("app_pages/slos.py", title="SLOs", url_path="slos"),
    st.Page("app_pages/alerts.py", title="Alerts", url_path="alerts"),
    st.Page("app_pages/probes.py", title="Probes", url_path="probes"),
    st.Page("app_pages/reports.py", title="Reports", url_path="reports"),
]
page = st.navigation(PAGES)


def _from_query(key: str, param: str, options: list[str]) -> None:
    # A link (?target=...&model=...) preselects, once per session and only a known value.
    wanted = st.query_params.get(param)
    if key not in st.session_state and wanted in options:
        st.session_state[key] = wanted


def _range() -> tuple[float, float]:
    now = loaders.now_quantized()
    choice = st.sidebar.selectbox("Time range", list(RANGES), index=1, key="sb_range")
    if choice != "custom":
        return now - RANGES[choice], now
    today = datetime.fromtimestamp(now, UTC).date()
    picked = st.sidebar.date_input("Dates (UTC)", (today - timedelta(days=1), today),
                                   max_value=today, key="sb_dates")
    days = [d for d in picked if isinstance(d, date)] if isinstance(picked, tuple) else [picked]
    first, last = (days[0], days[-1]) if days else (today, today)
    start = datetime.combine(first, time(), UTC).timestamp()
    end = min(datetime.combine(last + timedelta(days=1), time(), UTC).timestamp(), now)
    return start, max(end, start + 60)


def sidebar() -> Selection | None:
    st.sidebar.title("Tritonwatch")
    try:
        settings = loaders.settings(loaders.config_path())
        loaders.check(settings.store_url)
        inventory = loaders.inventory(settings.store_url)
    except (StoreError, loaders.DashboardError) as exc:
        # StoreError messages name the URL with its password masked.
        st.error("The store cannot be read.")
        st.text(str(exc))
        st.caption("Is `tritonwatch serve` running with the same --config, and has it "
                   "created the store?")
        return None
    try:
        slo_loaders.slo_specs(settings.rules_file)
    except loaders.DashboardError as exc:
        st.error("The rules file is invalid.")
        st.text(str(exc))
        st.caption("`tritonwatch check-rules FILE` lists every error with its key path.")
        return None
    start, end = _range()
    # Targets with model series, and those only scraped (or failing): a Fleet row's link
    # (?target=) to a target that is down must still select it.
    targets = sorted(set(inventory["target"]) | set(loaders.health(settings.store_url,
                                                                   end)["target"]))
    _from_query("sb_target", "target", [ALL, *targets])
    target = st.sidebar.selectbox("Target", [ALL, *targets], key="sb_target")
    rows = inventory if target == ALL else inventory[inventory["target"] == target]
    models = sorted(set(rows["model"]))
    _from_query("sb_model", "model", [ALL, *models])
    model = st.sidebar.selectbox("Model", [ALL, *models], key="sb_model")
    versions = sorted({v for v in rows[rows["model"] == model]["version"] if v})
    version = st.sidebar.selectbox("Version", [ALL, *versions], key="sb_version")
    st.sidebar.selectbox("Auto-refresh", list(REFRESH), key="sb_refresh")
    st.sidebar.caption(f"Store: {settings.store_redacted}")
    st.sidebar.caption(f"{loaders.utc_text(start)} → {loaders.utc_text(end)}")
    return Selection(
        settings, start, end, loaders.step_for(end - start, settings.scrape_interval),
        None if target == ALL else target, None if model == ALL else model,
        None if version == ALL else version,
    )


selection = sidebar()
if selection is None:
    st.stop()
st.session_state[KEY] = selection
page.run()
refresh = REFRESH[st.session_state.get("sb_refresh", "off")]
if refresh is not None:
    every: float = refresh
    st.session_state["tw_full_run_at"] = _clock.monotonic()

    @st.fragment(run_every=every)
    def _refresh() -> None:
        # The fragment's first run is part of this full run; its later, timed runs rerun the
        # whole app, so that "now", the range and every loader move on together.
        if _clock.monotonic() - st.session_state["tw_full_run_at"] >= every * 0.9:
            st.rerun()

    _refresh()
