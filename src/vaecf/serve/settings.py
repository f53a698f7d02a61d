"""ServeSettings: every setting of the server (address, auth, limits, micro-batching) with its
default, and the start-up rule for auth: a non-loopback address needs an API key or an explicit
`no_auth`."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from vaecf.errors import ConfigError

API_KEY_ENV = "VAECF_API_KEY"


@dataclass
class ServeSettings:
    run: str = ""  # run directory whose best model is served
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "cpu"
    precision: str = "fp32"
    api_key: str | None = None  # required as `Authorization: Bearer KEY` or `X-API-Key: KEY`
    no_auth: bool = False  # allow a non-loopback address without a key (behind a proxy)
    # micro-batching: requests arriving within `batch_wait_ms` of the first are scored together
    batch_wait_ms: float = 2.0
    max_batch_size: int = 256  # histories per scoring call
    # limits (413 / 422 with a JSON error naming the limit)
    max_body_bytes: int = 1 << 20
    max_history: int = 5000  # items per history
    max_k: int = 1000
    max_batch: int = 256  # histories per /v1/recommend/batch request
    max_filter: int = 100_000  # ids in an allow or deny list
    # POST /v1/admin/reload {"run": DIR} accepts run directories under this one only
    # (default: the directory that holds `run`)
    reload_root: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_body_bytes", "max_history", "max_k", "max_batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        if self.batch_wait_ms < 0:
            raise ConfigError("batch_wait_ms must be >= 0 (0: no micro-batching)")
        if not 0 <= self.port < 65536:
            raise ConfigError("port must lie in 0..65535")

    @property
    def limits(self) -> dict[str, int]:
        return {
            "max_body_bytes": self.max_body_bytes,
            "max_history": self.max_history,
            "max_k": self.max_k,
            "max_batch": self.max_batch,
            "max_filter": self.max_filter,
        }


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: may resolve anywhere


def read_api_key(path: str | None) -> str | None:
    """The key from `path` (first line, stripped) or else from $VAECF_API_KEY; None if neither."""
    if path:
        try:
            key = Path(path).read_text().strip()
        except OSError as e:
            raise ConfigError(f"cannot read --api-key-file {path}: {e.strerror}") from None
        if not key:
            raise ConfigError(f"--api-key-file {path} is empty; write the key on its first line")
        return key
    key = os.environ.get(API_KEY_ENV, "").strip()
    return key or None


def check_auth(settings: ServeSettings) -> None:
    """Refuse a non-loopback address with neither an API key nor an explicit no_auth."""
    if is_loopback(settings.host) or settings.api_key or settings.no_auth:
        return
    raise ConfigError(
        f"refusing to listen on {settings.host} without authentication: give --api-key-file "
        f"FILE (or set {API_KEY_ENV}), or pass --no-auth if a proxy in front authenticates"
    )
