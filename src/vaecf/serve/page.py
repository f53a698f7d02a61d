"""The web pages: `/` (search, history, recommendations, the model card) and the API reference at
`/docs` (every route of /openapi.json, drawn by docs.js), plain HTML, CSS and JavaScript shipped
in the package (static/), no build step and nothing fetched from elsewhere (the server may have
no internet; no third-party script may read the key the page keeps). The pages are shells with
no data in them, so they are served without the API key; everything they show comes from the API
(/v1/model, /v1/items, /v1/recommend, /v1/items/{id}/similar, /openapi.json), whose calls carry
the key the user types into the page, under the same rule as every client's. Every page has the
same strict Content-Security-Policy."""

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/docs": ("docs.html", "text/html; charset=utf-8"),
    "/ui/dom.js": ("dom.js", "text/javascript; charset=utf-8"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/ui/docs.js": ("docs.js", "text/javascript; charset=utf-8"),
    "/ui/style.css": ("style.css", "text/css; charset=utf-8"),
}
PAGE_PATHS = tuple(FILES)
# only this server's own files and API: no inline script, no other origin, no framing
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@cache
def _read(name: str) -> bytes:
    return resources.files("vaecf.serve").joinpath("static", name).read_bytes()


def _route(name: str, media_type: str):
    async def serve() -> Response:  # no parameters: nothing in a request picks the file
        return Response(_read(name), media_type=media_type, headers=HEADERS)

    return serve


def router() -> APIRouter:
    r = APIRouter()
    for path, (name, media_type) in FILES.items():
        r.add_api_route(
            path, _route(name, media_type), methods=["GET", "HEAD"], include_in_schema=False
        )
    return r
