"""The dashboard: a web page of the queries, as Spark UI's Structured Streaming tab shows them.

``StreamingSession(spark, ui_port=4050)`` serves the queries of this process (``ui_port=0``
picks a free port; ``ss.ui_url`` says where); ``microbatch ui CKPT [CKPT ...]`` serves
queries known by their checkpoints, read-only, from any process. The page lists the
queries (running, finished, failed), and for one query draws, live as its batches finish,
what Spark UI draws: input rate against process rate, batch duration stacked by phase,
input rows, state rows and state memory per operator, the watermark and the event-time
lag (the batch's time minus its watermark); then its last progress JSON, its plan and the
error of a failed query.

Starlette serves it (uvicorn, on a thread of its own); the page is static HTML and
JavaScript that reads ``/api/queries`` every second and draws with plotly.js, served from
the plotly package. ``/metrics`` is the Prometheus endpoint (``ops.metrics``).

    GET /                          the page
    GET /api/queries               every query's summary
    GET /api/queries/{key}         one query: summary, plan, progress (``?after=<ts>,<batch>``)
    GET /metrics                   Prometheus text
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from importlib import resources
from typing import Any

import plotly
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from microbatch.ops.metrics import metrics_text

log = logging.getLogger(__name__)

PLOTLY_JS = os.path.join(os.path.dirname(plotly.__file__), "package_data", "plotly.min.js")
REFRESH_MS = 1000


def _static_dir() -> str:
    return str(resources.files("microbatch.ops") / "static")


def build_app(queries: Any, title: str = "microbatch") -> Starlette:
    """The web application over ``queries`` (``ProcessQueries`` or ``CheckpointQueries``)."""

    def find(key: str):
        for history in queries.histories():
            if history.key == key:
                return history
        return None

    async def page(request: Request) -> Response:
        return FileResponse(os.path.join(_static_dir(), "index.html"), media_type="text/html")

    async def plotly_js(request: Request) -> Response:
        return FileResponse(PLOTLY_JS, media_type="application/javascript")

    async def list_queries(request: Request) -> Response:
        histories = await asyncio.to_thread(queries.histories)
        return JSONResponse({"title": title, "refreshMs": REFRESH_MS,
                             "queries": [h.summary() for h in histories]})

    async def one_query(request: Request) -> Response:
        history = await asyncio.to_thread(find, request.path_params["key"])
        if history is None:
            return JSONResponse({"error": f"no query {request.path_params['key']}"}, status_code=404)
        after_timestamp, _, after_batch = request.query_params.get("after", ",-1").partition(",")
        try:
            after = int(after_batch)
        except ValueError:
            return JSONResponse({"error": "after must be '<timestamp>,<batch id>'"}, status_code=400)
        plan = await asyncio.to_thread(queries.plan, history)
        return JSONResponse({"summary": history.summary(), "plan": plan, "runs": history.runs,
                             "progress": history.progress(after, after_timestamp)})

    async def metrics(request: Request) -> Response:
        text = await asyncio.to_thread(metrics_text, queries.histories)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return Starlette(routes=[
        Route("/", page),
        Route("/static/plotly.min.js", plotly_js),
        Mount("/static", StaticFiles(directory=_static_dir()), name="static"),
        Route("/api/queries", list_queries),
        Route("/api/queries/{key}", one_query),
        Route("/metrics", metrics),
    ])


class Dashboard:
    """The web server, on a daemon thread: ``start()`` returns once it listens."""

    def __init__(self, queries: Any, host: str = "127.0.0.1", port: int = 4050, title: str = "microbatch"):
        self.queries = queries
        self.host = host
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._app = build_app(queries, title)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def start(self) -> "Dashboard":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))   # a port in use fails here, in the caller's thread
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self._app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True, name=f"microbatch dashboard on {self.url}")
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            self._thread.join(0.02)
        log.info("The microbatch dashboard is at %s", self.url)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(5)

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted (the ``microbatch ui`` command)."""
        if self._thread is None:
            self.start()
        try:
            while self._thread.is_alive():
                self._thread.join(0.5)
        except KeyboardInterrupt:
            self.stop()
