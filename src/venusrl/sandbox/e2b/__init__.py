"""E2B's protocol over venusrl's sandboxes: agent code written for the `e2b` SDK runs
unchanged against `venusrl sandbox serve --e2b`.

    rest.py             the REST lifecycle API (create, get, list, kill, timeout, pause, connect)
    envd_process.py     envd's process.Process Connect service (commands)
    envd_filesystem.py  envd's filesystem.Filesystem service and /files (files)
    auth.py             API key and per-sandbox access tokens
    connect.py          the Connect protocol's JSON codec and envelopes; errors.py its error shapes
    app.py              the FastAPI app and a threaded server
"""
