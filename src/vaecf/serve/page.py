"""The web page at `/`: plain HTML, CSS and JavaScript shipped in the package (static/), no
build step and nothing fetched from elsewhere (the server may have no internet). The page is a
shell with no data in it, so it is served without the API key; everything it shows comes from
the API (/v1/model, /v1/items, /v1/recommend, /v1/items/{id}/similar), whose calls carry the key
the user types into the page, under the same rule as every client's."""

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
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
