"""The run page's web server: static pages and the JSON they ask for (aiohttp).

Pages: ``/`` (the run list) and ``/run?id=RUN`` (one run; ``&compare=OTHER`` overlays a
second run). JSON under ``/api/``: ``status``, ``runs``, ``run``, ``series``, ``timing``, ``quiet``,
``heatmap``, ``commands`` and ``step``; each takes the run as ``id``. An unknown run or step
answers 404 with ``{"error": "..."}``; an archive that cannot be read, 503 with its reason;
both are logged. The queries run on a worker thread, one at a time (:class:`RunData` holds
one DuckDB connection).

plotly.js is served from the installed ``plotly`` package (``package_data/plotly.min.js``),
so the page works without internet.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from rlpulse.archive.exceptions import ArchiveError
from rlpulse.ui.data import RunData
from rlpulse.ui.exceptions import NotFoundError, UiError

__all__ = ["UiServer"]

log = logging.getLogger(__name__)

STATIC: Final = Path(__file__).parent / "static"
_PAGES: Final = {"/": "index.html", "/run": "run.html"}
_ASSETS: Final = {"ui.js": "text/javascript", "ui.css": "text/css", "run.js": "text/javascript"}
_MAX_CELLS: Final = 2000
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _plotly_js() -> Path:
    try:
        path = importlib.resources.files("plotly") / "package_data" / "plotly.min.js"
    except ModuleNotFoundError:
        raise UiError(
            "the run page needs the plotly package (pip install -e '.[streams]')"
        ) from None
    return Path(str(path))


def _text(request: web.Request, name: str) -> str:
    value = request.query.get(name, "").strip()
    if not value:
        raise web.HTTPBadRequest(
            text=f'{{"error": "missing query parameter {name}"}}', content_type="application/json"
        )
    return value


def _number(request: web.Request, name: str, default: int | None = None) -> int:
    raw = request.query.get(name)
    if raw is None and default is not None:
        return default
    try:
        return int(raw or "")
    except ValueError:
        raise web.HTTPBadRequest(
            text=f'{{"error": "{name} must be a whole number, not {raw!r}"}}',
            content_type="application/json",
        ) from None


class UiServer:
    """Serves the run page for ``data`` on ``host:port`` from a thread of its own.

    :meth:`start` returns once the port listens (port 0: a free one, see :attr:`url`);
    :meth:`stop` closes it.
    """

    def __init__(self, data: RunData, host: str = "127.0.0.1", port: int = 8765) -> None:
        self.data = data
        self.host = host
        self.port = port
        self._plotly = _plotly_js()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        """The run list's address."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/"

    def app(self) -> web.Application:
        """The aiohttp application (routes of the module docstring)."""
        app = web.Application(middlewares=[self._errors])
        for path, page in _PAGES.items():
            app.router.add_get(path, self._file(STATIC / page, "text/html"))
        for name, kind in _ASSETS.items():
            app.router.add_get(f"/static/{name}", self._file(STATIC / name, kind))
        app.router.add_get("/static/plotly.min.js", self._file(self._plotly, "text/javascript"))
        api: dict[str, Callable[[web.Request], Any]] = {
            "status": self._status,
            "runs": lambda _request: self.data.runs(),
            "run": lambda request: self.data.overview(_text(request, "id")),
            "series": lambda request: self.data.series(
                _text(request, "id"), _text(request, "stage"), _text(request, "metric")
            ),
            "timing": lambda request: self.data.timing(_text(request, "id")),
            "heatmap": lambda request: self.data.heatmap(
                _text(request, "id"),
                _text(request, "stage"),
                _text(request, "metric"),
                min(_number(request, "max_ranks", 256), _MAX_CELLS),
                min(_number(request, "max_steps", 1000), _MAX_CELLS),
            ),
            "commands": lambda request: self.data.commands(_text(request, "id")),
            "quiet": lambda request: self.data.quiet(_text(request, "id")),
            "step": lambda request: self.data.step(_text(request, "id"), _number(request, "step")),
        }
        for name, answer in api.items():
            app.router.add_get(f"/api/{name}", self._json(answer))
        return app

    def _status(self, _request: web.Request) -> dict[str, Any]:
        return {
            "archive": self.data.root,
            "archive_problem": self.data.archive_problem(),
            "live_problem": self.data.live_problem(),
            "prefix": self.data.settings.prefix,
        }

    @staticmethod
    def _file(path: Path, kind: str) -> Handler:
        async def serve(_request: web.Request) -> web.StreamResponse:
            headers = {"Cache-Control": "max-age=3600"} if "plotly" in path.name else {}
            return web.FileResponse(path, headers={"Content-Type": kind, **headers})

        return serve

    @staticmethod
    def _json(answer: Callable[[web.Request], Any]) -> Handler:
        async def serve(request: web.Request) -> web.StreamResponse:
            # The query parameters are read here (a bad one answers 400 before any SQL).
            body = await asyncio.to_thread(answer, request)
            return web.json_response(body)

        return serve

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except NotFoundError as exc:
            log.info("ui: %s %s: %s", request.method, request.path_qs, exc)
            return web.json_response({"error": str(exc)}, status=404)
        except ArchiveError as exc:
            log.warning("ui: %s %s: %s", request.method, request.path_qs, exc)
            return web.json_response({"error": f"the archive cannot answer: {exc}"}, status=503)
        except Exception as exc:
            log.exception("ui: %s %s failed", request.method, request.path_qs)
            return web.json_response(
                {"error": f"the server failed: {type(exc).__name__}: {exc}"}, status=500
            )

    # -- running in a thread -----------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> None:
        """Listen on ``host:port`` from a thread; raise :class:`UiError` if it cannot."""
        self._thread = threading.Thread(target=self._serve, name="rlpulse-ui", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise UiError(f"the run page's server did not start within {timeout_s:g} s")
        if self._failure is not None:
            raise UiError(
                f"cannot serve the run page on {self.host}:{self.port}: {self._failure}"
            ) from self._failure

    def _serve(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._listen())
        except OSError as exc:
            self._failure = exc
            self._ready.set()
            return
        self._ready.set()
        loop.run_forever()
        if self._runner is not None:
            loop.run_until_complete(self._runner.cleanup())
        loop.close()

    async def _listen(self) -> None:
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        sockets = [s for s in runner.addresses if isinstance(s, tuple)]
        if sockets:
            self.port = int(sockets[0][1])

    def stop(self) -> None:
        """Stop serving and close the data's connection."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10.0)
        self.data.close()
