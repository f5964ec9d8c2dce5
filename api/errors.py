"""Error answers of the query API, in Prometheus's shape and with its status codes.

========================  =====  ===============  =============================================
raised                    code   ``errorType``    when
========================  =====  ===============  =============================================
a bad parameter           400    ``bad_data``     a value FastAPI or :mod:`api.params` refuses,
(``RequestValidation``,                           named: ``invalid parameter "step": ...``
``QueryError``)
``LimitExceeded``         422    ``execution``    a query selects more series, or would read
                                                  more samples, than ``api.max_series`` /
                                                  ``api.max_samples`` allow
``StoreError``            503    ``unavailable``  the database is down or failing
``Busy``                  503    ``unavailable``  the API's read threads and queue are full
========================  =====  ===============  =============================================

Bodies are ``{"status": "error", "errorType": ..., "error": ...}`` as Prometheus's HTTP API
answers them.  A StoreError's text (the redacted store URL and the driver's reason) goes to the
log, rate-limited, not to the client: readers need not learn where the database lives.
"""

from __future__ import annotations

import logging
import threading
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from tritonwatch.api.pool import Busy
from tritonwatch.store.errors import LimitExceeded, QueryError, StoreError

log = logging.getLogger("tritonwatch.api")

#: Seconds a client is told to wait after a 503.
RETRY_AFTER_S = 5

#: A failing store is logged at most this often (a dashboard polling an outage would
#: otherwise write a line per panel per refresh).
STORE_ERROR_LOG_EVERY_S = 60.0


class ApiError(Exception):
    """An error answer: HTTP ``status``, Prometheus ``error_type`` and a message."""

    def __init__(self, status: int, error_type: str, message: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers


def bad_param(name: str, why: str) -> ApiError:
    """400 for the query parameter ``name``, worded as Prometheus words it."""
    return ApiError(400, "bad_data", f'invalid parameter "{name}": {why}')


def error_response(status: int, error_type: str, message: str,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"status": "error", "errorType": error_type, "error": message},
                        status_code=status, headers=headers)


class _Throttle:
    """True at most once per ``every`` seconds; counts what it held back."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._next = 0.0
        self._held = 0
        self._lock = threading.Lock()

    def __call__(self) -> int | None:
        """None to stay quiet, else how many calls were held back since the last True."""
        with self._lock:
            now = time.monotonic()
            if now < self._next:
                self._held += 1
                return None
            self._next = now + self.every
            held, self._held = self._held, 0
            return held


def install_error_handlers(app: FastAPI) -> None:
    """Map the exceptions of the table above to their answers."""
    throttle = _Throttle(STORE_ERROR_LOG_EVERY_S)
    retry = {"Retry-After": str(RETRY_AFTER_S)}

    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.error_type, exc.message, exc.headers)

    async def validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        problems = []
        for err in exc.errors():
            # ("query", "step") -> step; the value itself is not echoed back.
            where = ".".join(str(p) for p in err.get("loc", ())[1:]) or "request"
            problems.append(f'invalid parameter "{where}": {err.get("msg", "invalid")}')
        return error_response(400, "bad_data", "; ".join(problems) or "invalid request")

    async def limit(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, LimitExceeded)
        setting = {"series": "api.max_series", "samples": "api.max_samples"}.get(exc.what, "")
        hint = ("narrow it with target= or a more specific name" if exc.what == "series"
                else "shorten the range, or use a step that is a multiple of 5m or 1h "
                     "(rollups)")
        return error_response(422, "execution", f"{exc} ({setting}); {hint}")

    async def query(_: Request, exc: Exception) -> JSONResponse:
        return error_response(400, "bad_data", str(exc))

    async def store(_: Request, exc: Exception) -> JSONResponse:
        held = throttle()
        if held is not None:
            log.warning("API read failed, answering 503: %s%s", exc,
                        f" ({held} more since the last report)" if held else "")
        return error_response(503, "unavailable",
                              "the store (database) is unavailable; retry later", retry)

    async def busy(_: Request, exc: Exception) -> JSONResponse:
        return error_response(503, "unavailable", str(exc), retry)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, validation)
    # Looked up along the exception's MRO: LimitExceeded gets its own, other QueryErrors 400.
    app.add_exception_handler(LimitExceeded, limit)
    app.add_exception_handler(QueryError, query)
    app.add_exception_handler(StoreError, store)
    app.add_exception_handler(Busy, busy)
