"""ServeSettings: every setting of the server (address, auth, limits, micro-batching) with its
default, and the start-up rule for auth: a non-loopback address needs an API key or an explicit
`no_auth`."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import Literal

from vaecf.config.settings import Scoring, setting
from vaecf.errors import ConfigError

API_KEY_ENV = "VAECF_API_KEY"
# the scoring worker turns at least this often when idle; /healthz calls it stuck after
# stuck_after_s without a turn, so stuck_after_s must leave room for two turns
IDLE_BEAT_S = 0.5
MIN_STUCK_AFTER_S = 2 * IDLE_BEAT_S


@dataclass
class ServeSettings(Scoring):
    """Every setting of the server; the device and precision are `Scoring`'s. The flags of
    `vaecf serve` are generated from these declarations (vaecf.cli.options)."""

    run: str = setting("", "run directory whose best model is served")
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(8000, "port")
    api_key: str | None = setting(None, "required as `Authorization: Bearer KEY` or `X-API-Key`")
    no_auth: bool = setting(
        False,
        "allow a non-loopback --host without an API key (a proxy authenticates)",
        action="store_true",
    )
    batch_wait_ms: float = setting(
        2.0,
        "micro-batching: requests arriving this long after the first are scored together (0: off)",
    )
    max_batch_size: int = setting(256, "histories per scoring call")
    scoring_nice: int = setting(
        0,
        "niceness added to the scoring thread and its OpenMP helpers, so that the event loop "
        "outranks them for a core: a lower tail at concurrency 1 on a machine of the server's "
        "own, but beside busy processes they get the cores (at most 19)",
    )
    # limits (413 / 422 with a JSON error naming the limit)
    max_body_bytes: int = setting(1 << 20, "bytes of a request body")
    max_history: int = setting(5000, "items per history")
    max_k: int = setting(1000, "largest k")
    max_batch: int = setting(256, "histories per batch request (at most --max-batch-size)")
    max_filter: int = setting(100_000, "ids in an allow or deny list")
    max_answer_items: int = setting(25_000, "histories x k in one answer (422 beyond)")
    max_answer_bytes: int = setting(
        8 << 20, "bytes of one JSON answer (422 beyond: ask for fewer histories or a smaller k)"
    )
    max_queue: int = setting(
        1024, "histories waiting to be scored; beyond, 503 with Retry-After at once"
    )
    max_call_queue: int = setting(
        64,
        "similar-items, item-search and user requests waiting for the scoring worker; beyond, "
        "503 with Retry-After at once",
    )
    request_timeout_s: float = setting(
        10.0, "seconds a request may wait for its answer before a 503", flag="--request-timeout"
    )
    head_timeout_s: float = setting(
        5.0,
        "seconds a connection has to send a request's head, from its first byte (or from "
        "opening); then 408 and closed",
        flag="--head-timeout",
    )
    body_timeout_s: float = setting(
        30.0,
        "seconds a request's body has to arrive once its head has; then 408 and closed",
        flag="--body-timeout",
    )
    limit_concurrency: int = setting(
        512, "connections and requests at once; uvicorn answers 503 beyond"
    )
    reload_root: str | None = setting(
        None,
        'POST /v1/admin/reload {"run": DIR} loads run directories under this one only (unset: '
        "the directory holding RUN)",
    )
    admin_key: str | None = setting(None, "for /v1/admin/*; needed unless loopback-only")
    reload_min_interval_s: float = setting(
        1.0, "seconds between reloads; closer ones get 429", flag="--reload-min-interval"
    )
    reload_timeout_s: float = setting(
        120.0,
        "seconds a reload may read and check its run; beyond, it fails (503) and the old model "
        "keeps serving",
        flag="--reload-timeout",
    )
    allowed_hosts: list[str] = setting(
        help="a Host header name to answer besides localhost, 127.0.0.1, ::1 and --host "
        "(repeatable; '*': any, e.g. behind a proxy that checks it)",
        factory=list,
        flag="--allowed-host",
        action="append",
        metavar="NAME",
    )
    expose_paths: bool = setting(
        False,
        "name the run directory's absolute path in answers (else its name only)",
        action="store_true",
    )
    shutdown_delay_s: float = setting(
        2.0,
        "after SIGTERM, seconds /readyz answers 503 before the drain starts",
        flag="--shutdown-delay",
    )
    drain_s: float = setting(30.0, "then, seconds requests in flight get to finish", flag="--drain")
    stuck_after_s: float = setting(
        30.0, "seconds of one scoring call after which /healthz answers 503", flag="--stuck-after"
    )
    log_level: Literal["debug", "info", "warning", "error"] = setting("info", "server log level")
    access_log: bool = setting(
        False,
        "log a line per request to stderr (it costs ~40 us a request; /metrics counts requests "
        "by route and status)",
        action="store_true",
    )

    def __post_init__(self) -> None:
        for name in (
            "max_batch_size",
            "max_body_bytes",
            "max_history",
            "max_k",
            "max_batch",
            "max_answer_items",
            "max_answer_bytes",
            "max_queue",
            "max_call_queue",
            "limit_concurrency",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        if not 0 <= self.scoring_nice <= 19:
            raise ConfigError(
                f"scoring_nice must be 0-19 (a niceness added), not {self.scoring_nice}"
            )
        if self.max_batch > self.max_batch_size:
            raise ConfigError(
                f"max_batch ({self.max_batch} histories per request) exceeds max_batch_size "
                f"({self.max_batch_size} per scoring call); raise max_batch_size or lower "
                "max_batch"
            )
        if self.batch_wait_ms < 0:
            raise ConfigError("batch_wait_ms must be >= 0 (0: no micro-batching)")
        for name in ("request_timeout_s", "head_timeout_s", "body_timeout_s", "reload_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be a positive number of seconds")
        if not self.stuck_after_s >= MIN_STUCK_AFTER_S:
            raise ConfigError(
                f"stuck_after_s (--stuck-after) must be at least {MIN_STUCK_AFTER_S:g} s, not "
                f"{self.stuck_after_s:g}: the idle scoring worker turns every {IDLE_BEAT_S:g} s, "
                "and a shorter value would make /healthz call an idle server stuck"
            )
        for name in ("reload_min_interval_s", "shutdown_delay_s", "drain_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0 seconds")
        if not 0 <= self.port < 65536:
            raise ConfigError("port must lie in 0..65535")

    def host_names(self) -> set[str] | None:
        """The Host header names (no port) this server answers, or None for any ("*")."""
        if "*" in self.allowed_hosts:
            return None
        names = {"localhost", "127.0.0.1", "::1", self.host.lower()}
        names.discard("0.0.0.0")
        names.discard("::")
        return names | {h.lower() for h in self.allowed_hosts}

    def admin_open(self) -> bool:
        """Whether /v1/admin/* may answer without an admin key: only on a loopback-only server
        that was given none."""
        return self.admin_key is None and is_loopback(self.host)

    @property
    def limits(self) -> dict[str, int]:
        return {
            "max_body_bytes": self.max_body_bytes,
            "max_history": self.max_history,
            "max_k": self.max_k,
            "max_batch": self.max_batch,
            "max_filter": self.max_filter,
            "max_answer_items": self.max_answer_items,
            "max_answer_bytes": self.max_answer_bytes,
        }


def host_name(header: str) -> str:
    """The name a Host header gives, lower case, without its port ("[::1]:8000": "::1")."""
    host = header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: may resolve anywhere


MIN_KEY_CHARS = 16


def _checked_key(key: str, where: str) -> str:
    if len(key) < MIN_KEY_CHARS:
        raise ConfigError(
            f"{where}: the key has {len(key)} characters; use at least {MIN_KEY_CHARS} "
            "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )
    if any(not c.isprintable() or c.isspace() for c in key):
        raise ConfigError(f"{where}: the key holds spaces or control characters; remove them")
    return key


def read_key_file(path: str, flag: str = "--api-key-file") -> str:
    """The key on the first line of `path` (stripped; the rest of the file is ignored)."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline(4096)
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or str(e)
        raise ConfigError(f"cannot read {flag} {path}: {why}") from None
    key = first.strip()
    if not key:
        raise ConfigError(f"{flag} {path}: its first line is empty; write the key there")
    return _checked_key(key, f"{flag} {path}")


def read_api_key(path: str | None) -> str | None:
    """The key from `path` (first line, stripped) or else from $VAECF_API_KEY; None if neither."""
    if path:
        return read_key_file(path)
    key = os.environ.get(API_KEY_ENV, "").strip()
    return _checked_key(key, f"${API_KEY_ENV}") if key else None


def check_auth(settings: ServeSettings) -> None:
    """Refuse a non-loopback address with neither an API key nor an explicit no_auth."""
    if is_loopback(settings.host) or settings.api_key or settings.no_auth:
        return
    raise ConfigError(
        f"refusing to listen on {settings.host} without authentication: give --api-key-file "
        f"FILE (or set {API_KEY_ENV}), or pass --no-auth if a proxy in front authenticates"
    )
