"""serve(): load and check the model, then run the app on uvicorn until SIGTERM or SIGINT.

Start-up refuses (ConfigError, exit 2) before listening when the address is not loopback and
neither an API key nor --no-auth is given, and when the run does not load. SIGTERM: uvicorn
stops accepting, lets requests in flight finish (up to `graceful_s`), then the app's lifespan
scores what is queued and stops its worker. SIGHUP reloads the model (app.py).
"""

from __future__ import annotations

import logging

from vaecf.serve.settings import ServeSettings, check_auth


def serve(settings: ServeSettings, log_level: str = "info", graceful_s: float = 30.0) -> None:
    import uvicorn

    from vaecf.serve.app import create_app
    from vaecf.serve.reload import ModelHolder

    check_auth(settings)
    holder = ModelHolder.load(settings.run, settings.device, settings.precision)
    app = create_app(holder, settings)
    logger = logging.getLogger("vaecf.serve")
    logger.setLevel(log_level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     vaecf: %(message)s"))
        logger.addHandler(handler)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        timeout_graceful_shutdown=graceful_s,
        server_header=False,
    )
    print(
        f"serving {holder.current.version['name']} from {holder.current.version['run']} on "
        f"http://{settings.host}:{settings.port} (auth: "
        f"{'API key' if settings.api_key else 'none'}; docs at /docs)",
        flush=True,
    )
    uvicorn.Server(config).run()
