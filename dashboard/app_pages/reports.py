"""Reports: the weekly SLO reports `serve` made (or `tritonwatch report` kept), newest first;
one of them shown as it was mailed, with its HTML, Markdown and JSON to download."""

from __future__ import annotations

import streamlit as st
import streamlit.components.v1 as components

from tritonwatch.dashboard import slo_loaders
from tritonwatch.dashboard.state import current

sel = current()
st.header("Weekly SLO reports")
table = slo_loaders.reports(sel.url)
if table.empty:
    st.info("No weekly report yet — `serve` makes one each week (`reports:` in the config), "
            "or run `tritonwatch report` for the last complete week.")
    st.stop()
st.dataframe(table.drop(columns=["id"]), hide_index=True, width="stretch", key="reports_list")

labels = {int(i): f"{week} ({tz})"
          for i, week, tz in zip(table["id"], table["week"], table["time zone"], strict=True)}
chosen = st.selectbox("Report", list(labels), format_func=labels.__getitem__,
                      key="reports_pick")
html = slo_loaders.report_document(sel.url, chosen, "html")
if html is None:
    st.warning("That report is no longer in the store.")
    st.stop()
cols = st.columns(3)
for col, fmt, mime in zip(cols, ("html", "md", "json"),
                          ("text/html", "text/markdown", "application/json"), strict=True):
    text = slo_loaders.report_document(sel.url, chosen, fmt)
    if text is not None:
        col.download_button(f"Download {fmt.upper()}", text,
                            file_name=f"{labels[chosen].split()[0]}.{fmt}", mime=mime,
                            key=f"reports_dl_{fmt}")
# The report is our own document (escaped by its template), shown in a sandboxed frame as a
# mail client would show it.
components.html(html, height=1400, scrolling=True)
