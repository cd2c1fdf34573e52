"""The web console: server-rendered pages (Starlette + Jinja2) over the admin client.

Pages: overview (brokers), topics (queues, offsets, rates), groups (members, allocation, lag per
queue, a lag-over-time chart), message lookup by id or key with body previews, a group's DLQ with
re-send, and offset resets behind a confirmation page. Every action here is also a CLI command,
and both call the same AdminClient method (docs/operations.md, "The web console", lists them).
Forms are plain urlencoded posts, parsed here (no multipart dependency).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from equeue_core.broker.topics import DLQ_PREFIX
from equeue_core.cli.stats import human_bytes, human_seconds
from equeue_core.client.admin import reset_target
from equeue_core.console.backend import BrokerUnreachable, ConsoleBackend
from equeue_core.console.preview import preview
from equeue_core.errors import EQueueError

HERE = Path(__file__).resolve().parent


def _fmt_ms(ms: int | None) -> str:
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d} UTC"


def _templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
    env.filters.update(bytes=human_bytes, ms=_fmt_ms, seconds=human_seconds, q=lambda s: quote(str(s), safe=""))
    return env


async def _form(request: Request) -> dict[str, list[str]]:
    return parse_qs((await request.body()).decode("utf-8", "replace"))


def create_app(broker: str, sample_interval: float = 5.0) -> Starlette:
    backend = ConsoleBackend(broker, sample_interval)
    templates = _templates()

    def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("title", template.split(".")[0])
        html = templates.get_template(template).render(request=request, broker=backend.broker,
                                                    sampler_error=backend.last_error, **context)
        return HTMLResponse(html, status_code=status)

    async def guarded(request: Request, handler: Any) -> Response:
        try:
            return await handler(request)
        except BrokerUnreachable as e:
            return page(request, "error.html", 503, title="broker unreachable", message=str(e))
        except EQueueError as e:
            return page(request, "error.html", 400, title="error", message=str(e))

    def route(path: str, handler: Any, methods: tuple[str, ...] = ("GET",)) -> Route:
        async def endpoint(request: Request) -> Response:
            return await guarded(request, handler)
        return Route(path, endpoint, methods=list(methods))

    # ---------------------------------------------------------------- pages

    async def overview(request: Request) -> Response:
        info = await backend.call("broker_info")
        stats = await backend.call("stats")
        return page(request, "overview.html", title="overview", info=info, stats=stats,
                    brokers=[{"address": info["address"], "info": info, "stats": stats}])

    async def topics(request: Request) -> Response:
        system = request.query_params.get("system") == "1"
        listed = await backend.call("topics", system=system)
        rates = backend.topic_rates()
        rows = [{"name": t, "queues": d["queues"], "messages": sum(hi - lo for lo, hi in d["ranges"]),
                 "max": sum(hi for _, hi in d["ranges"]), "rate": rates.get(t)} for t, d in listed.items()]
        return page(request, "topics.html", title="topics", rows=rows, system=system)

    async def topic(request: Request) -> Response:
        name = request.path_params["topic"]
        ranges = await backend.call("queue_ranges", name)
        groups = await backend.call("groups")
        readers = {g: [r for r in info["queues"] if r["topic"] == name] for g, info in groups.items()}
        return page(request, "topic.html", title=f"topic {name}", name=name, ranges=ranges,
                    rate=backend.topic_rates().get(name), readers={g: r for g, r in readers.items() if r})

    async def groups(request: Request) -> Response:
        listed = await backend.call("groups")
        rows = [{"name": g, "members": len(i["members"]), "lag": sum(r["lag"] for r in i["queues"]),
                 "topics": sorted({r["topic"] for r in i["queues"]})}
                for g, i in listed.items() if not g.startswith("%")]
        return page(request, "groups.html", title="groups", rows=rows)

    async def group(request: Request) -> Response:
        name = request.path_params["group"]
        info = (await backend.call("groups", name))[name]
        await backend.sample()  # a fresh point, so the chart has one even on a first visit
        return page(request, "group.html", title=f"group {name}", name=name, info=info,
                    lag=sum(r["lag"] for r in info["queues"]),
                    topics=sorted({r["topic"] for r in info["queues"]}),
                    notice=request.query_params.get("notice"))

    async def group_lag(request: Request) -> Response:
        name = request.path_params["group"]
        info = (await backend.call("groups", name))[name]
        return JSONResponse({"series": backend.lag_series(name), "lag": sum(r["lag"] for r in info["queues"]),
                             "queues": info["queues"], "members": info["members"]})

    async def reset_confirm(request: Request) -> Response:
        name = request.path_params["group"]
        topic_name = request.query_params.get("topic", "")
        to_text = request.query_params.get("to", "").strip()
        if to_text == "timestamp":
            to_text = request.query_params.get("ts", "").strip()
        target = reset_target(to_text)
        info = (await backend.call("groups", name))[name]
        rows = [r for r in info["queues"] if r["topic"] == topic_name]
        return page(request, "reset.html", title=f"reset {name}", name=name, topic=topic_name,
                    to=target, to_text=_fmt_ms(target) if isinstance(target, int) else target,
                    rows=rows, members=info["members"])

    async def reset_apply(request: Request) -> Response:
        name = request.path_params["group"]
        form = await _form(request)
        if form.get("confirm", [""])[0] != "yes":
            raise EQueueError("the reset was not confirmed")
        target = reset_target(form.get("to", [""])[0])
        done = await backend.call("reset_offsets", name, form.get("topic", [""])[0], target)
        notice = "offsets reset: " + ", ".join(f"{t}/{q} -> {o}" for t, q, o in done)
        return RedirectResponse(f"/groups/{quote(name, safe='')}?{urlencode({'notice': notice})}", 303)

    async def dlq(request: Request) -> Response:
        name = request.path_params["group"]
        count = min(1000, int(request.query_params.get("count", "100")))
        msgs = await backend.call("dlq_messages", name, 0, count)
        return page(request, "dlq.html", title=f"DLQ of {name}", name=name, dlq_topic=DLQ_PREFIX + name,
                    messages=[(m, preview(m.body)) for m in msgs], notice=request.query_params.get("notice"))

    async def dlq_resend(request: Request) -> Response:
        name = request.path_params["group"]
        ids = (await _form(request)).get("msg_id", [])
        if not ids:
            raise EQueueError("choose at least one message to re-send")
        n = await backend.call("resend_dlq", name, ids)
        return RedirectResponse(f"/groups/{quote(name, safe='')}/dlq?"
                                f"{urlencode({'notice': f're-sent {n} messages to their topics'})}", 303)

    async def messages(request: Request) -> Response:
        q = request.query_params
        msg_id, topic_name, key = q.get("id", "").strip(), q.get("topic", "").strip(), q.get("key", "").strip()
        found: list[Any] = []
        searched = False
        if msg_id:
            searched = True
            found = [await backend.call("get_message", msg_id)]
        elif topic_name and key:
            searched = True
            found = await backend.call("find_by_key", topic_name, key, 32)
        return page(request, "messages.html", title="messages", msg_id=msg_id, topic=topic_name, key=key,
                    searched=searched, messages=[(m, preview(m.body)) for m in found])

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        backend.start()
        try:
            yield
        finally:
            await backend.stop()

    app = Starlette(routes=[
        route("/", overview),
        route("/topics", topics),
        route("/topics/{topic}", topic),
        route("/groups", groups),
        route("/groups/{group}", group),
        route("/api/groups/{group}/lag", group_lag),
        route("/groups/{group}/reset", reset_confirm),
        route("/groups/{group}/reset", reset_apply, ("POST",)),
        route("/groups/{group}/dlq", dlq),
        route("/groups/{group}/dlq/resend", dlq_resend, ("POST",)),
        route("/messages", messages),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ], lifespan=lifespan)
    app.state.backend = backend
    return app
