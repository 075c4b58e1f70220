"""The web console (`gptrain ui`): app.py (ASGI app, serve), routes.py (pages, API, streams,
actions), views.py (reads through jobs/store, data/store, metrics.jsonl, logs), metrics.py
(charts over the library's metrics.jsonl reader, jobs/metrics_file.py), downsample.py, sse.py, security.py; static/
holds the pages' scripts and the vendored uPlot chart library (MIT, static/uPlot.LICENSE)."""
