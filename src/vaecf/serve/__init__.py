"""HTTP serving of a run's model: a thin FastAPI adapter over `Recommender`.

    reload.py     ModelHolder: the model that answers, loaded, checked and swapped atomically
    batcher.py    MicroBatcher: concurrent requests gathered and scored as one batch, one thread
    prometheus.py Prometheus counters and histograms of one app
    schemas.py    request and response models (with the limits), JSON answers and errors
    service.py    Service: what the routes share, and the steps they take (score, answer, reload)
    guard.py      Guard: the one middleware: Host, keys, limits, metrics, no tracebacks to clients
    recommend.py  items.py  admin.py  ops.py  page.py: the routers, one per concern
    app.py        create_app: the Service, the routers and the Guard
    server.py     serve(): uvicorn with SIGHUP (reload) and SIGTERM (graceful shutdown)
    fixtures.py   fresh_run(): a run directory from an untrained model (load tests, smoke tests)

Its settings are vaecf.config.serve (ServeSettings). Importing this package imports FastAPI:
install the `serve` extra (`pip install vaecf[serve]`).
"""

from __future__ import annotations

from vaecf.config.serve import ServeSettings

__all__ = ["ServeSettings"]
