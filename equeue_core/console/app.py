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
from equeue_core.console.cluster import ClusterBackend
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


async def _lookup(source: Any, method: str, *args: Any) -> Any:
    """A message lookup through the one broker's backend, or through the cluster admin client."""
    if isinstance(source, ConsoleBackend):
        return await source.call(method, *args)
    try:
        return await getattr(source, method)(*args)
    except OSError as e:
        raise BrokerUnreachable(f"the broker did not answer: {e}") from None


def create_app(broker: str | None = None, sample_interval: float = 5.0, nameserver: str | None = None) -> Starlette:
    """The console of one broker (`broker`), or of a cluster (`nameserver`: its brokers come from
    the name servers, and the pages gain a broker column)."""
    cluster = ClusterBackend(nameserver, sample_interval) if nameserver else None
    backend: Any = cluster or ConsoleBackend(broker or "127.0.0.1:10911", sample_interval)
    templates = _templates()

    def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("title", template.split(".")[0])
        html = templates.get_template(template).render(request=request, broker=backend.broker,
                                                    sampler_error=backend.last_error,
                                                    cluster=cluster is not None, **context)
        return HTMLResponse(html, status_code=status)

    async def per_broker(method: str, *args: Any, broker: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """broker -> its answer to the AdminClient method. With one broker, its errors propagate
        (the page becomes an error page); in a cluster a broker's error is its entry."""
        if cluster is None:
            return {backend.broker: await backend.call(method, *args, **kwargs)}
        return await cluster.each(method, *args, broker=broker, **kwargs)

    def answered(answers: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The brokers that answered, and one line per broker that did not (shown on the page)."""
        good = {b: a for b, a in answers.items() if not isinstance(a, BaseException)}
        return good, [f"broker {b}: {a}" for b, a in answers.items() if isinstance(a, BaseException)]

    def rates_of(name: str) -> dict[str, tuple[float, float]]:
        return cluster.backends[name].topic_rates() if cluster else backend.topic_rates()

    async def sample_now() -> None:
        await backend.sample()

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
        if cluster is not None:
            live = await cluster.refresh()
            infos, errors = answered(await cluster.each("broker_info"))
            rates = cluster.rates()
            brokers = [{"cluster": b.cluster, "name": b.name, "address": b.address, "role": "master",
                        "topics": b.topics, "heartbeat": b.heartbeat_age_s, "rate": rates.get(b.name),
                        "info": infos.get(b.name)} for b in live]
            return page(request, "overview.html", title="overview", brokers=brokers, errors=errors)
        info = await backend.call("broker_info")
        stats = await backend.call("stats")
        return page(request, "overview.html", title="overview", info=info, stats=stats,
                    brokers=[{"address": info["address"], "info": info, "stats": stats}])

    async def topics(request: Request) -> Response:
        system = request.query_params.get("system") == "1"
        listed, errors = answered(await per_broker("topics", system=system))
        rows = []
        for b, answer in listed.items():
            rates = rates_of(b)
            rows += [{"broker": b, "name": t, "queues": d["queues"], "messages": sum(hi - lo for lo, hi in d["ranges"]),
                      "max": sum(hi for _, hi in d["ranges"]), "rate": rates.get(t)} for t, d in answer.items()]
        rows.sort(key=lambda r: (r["name"], r["broker"]))
        return page(request, "topics.html", title="topics", rows=rows, system=system, errors=errors)

    async def topic(request: Request) -> Response:
        name = request.path_params["topic"]
        if cluster is None:
            per = {backend.broker: await backend.call("queue_ranges", name)}
            errors: list[str] = []
        else:
            per, errors = answered(await cluster.each("queue_ranges", name))
            per = {b: r for b, r in per.items() if r}
        groups, more = answered(await per_broker("groups"))
        readers: dict[str, list[Any]] = {}
        for info in groups.values():
            for g, gi in info.items():
                readers.setdefault(g, []).extend(r for r in gi["queues"] if r["topic"] == name)
        rates = [rates_of(b).get(name) for b in per]
        known = [r for r in rates if r]
        rate = (sum(r[0] for r in known), sum(r[1] for r in known)) if known else None
        return page(request, "topic.html", title=f"topic {name}", name=name, per_broker=per, rate=rate,
                    readers={g: r for g, r in readers.items() if r}, errors=errors + more)

    async def groups(request: Request) -> Response:
        listed, errors = answered(await per_broker("groups"))
        rows = [{"broker": b, "name": g, "members": len(i["members"]), "lag": sum(r["lag"] for r in i["queues"]),
                 "topics": sorted({r["topic"] for r in i["queues"]})}
                for b, answer in listed.items() for g, i in answer.items() if not g.startswith("%")]
        rows.sort(key=lambda r: (r["name"], r["broker"]))
        return page(request, "groups.html", title="groups", rows=rows, errors=errors)

    async def group_view(name: str) -> tuple[dict[str, Any], list[str]]:
        """The group across the brokers: members and queue rows, each with its broker."""
        answers, errors = answered(await per_broker("groups", name))
        members, queues = [], []
        for b, answer in answers.items():
            info = answer.get(name)
            if info is None:
                continue
            members += [{**m, "broker": b} for m in info["members"]]
            queues += [{**r, "broker": b} for r in info["queues"]]
        if not answers:
            raise BrokerUnreachable("; ".join(errors) or "no broker answered")
        return {"members": members, "queues": queues, "dlq_topic": DLQ_PREFIX + name}, errors

    async def group(request: Request) -> Response:
        name = request.path_params["group"]
        info, errors = await group_view(name)
        await sample_now()  # a fresh point, so the chart has one even on a first visit
        return page(request, "group.html", title=f"group {name}", name=name, info=info,
                    lag=sum(r["lag"] for r in info["queues"]),
                    topics=sorted({r["topic"] for r in info["queues"]}),
                    brokers=sorted({r["broker"] for r in info["queues"]}),
                    notice=request.query_params.get("notice"), errors=errors)

    async def group_lag(request: Request) -> Response:
        name = request.path_params["group"]
        info, _ = await group_view(name)
        if cluster is None:  # the one-broker answer keeps its shape (no broker field)
            info = {"queues": [{k: v for k, v in r.items() if k != "broker"} for r in info["queues"]],
                    "members": [{k: v for k, v in m.items() if k != "broker"} for m in info["members"]]}
        return JSONResponse({"series": backend.lag_series(name), "lag": sum(r["lag"] for r in info["queues"]),
                             "queues": info["queues"], "members": info["members"]})

    async def reset_confirm(request: Request) -> Response:
        name = request.path_params["group"]
        topic_name = request.query_params.get("topic", "")
        chosen = request.query_params.get("broker", "").strip() or None
        to_text = request.query_params.get("to", "").strip()
        if to_text == "timestamp":
            to_text = request.query_params.get("ts", "").strip()
        target = reset_target(to_text)
        info, errors = await group_view(name)
        rows = [r for r in info["queues"] if r["topic"] == topic_name and (chosen is None or r["broker"] == chosen)]
        return page(request, "reset.html", title=f"reset {name}", name=name, topic=topic_name,
                    to=target, to_text=_fmt_ms(target) if isinstance(target, int) else target,
                    rows=rows, members=info["members"], chosen=chosen,
                    chosen_address=cluster.summaries[chosen].address if cluster and chosen in cluster.summaries else None,
                    brokers=sorted({r["broker"] for r in rows}), errors=errors)

    async def reset_apply(request: Request) -> Response:
        name = request.path_params["group"]
        form = await _form(request)
        if form.get("confirm", [""])[0] != "yes":
            raise EQueueError("the reset was not confirmed")
        target = reset_target(form.get("to", [""])[0])
        topic_name = form.get("topic", [""])[0]
        if cluster is None:
            done = await backend.call("reset_offsets", name, topic_name, target)
            notice = "offsets reset: " + ", ".join(f"{t}/{q} -> {o}" for t, q, o in done)
        else:
            # The brokers the confirmation listed (each has the topic), one at a time.
            parts = []
            for b in form.get("broker", []):
                done = await cluster.chosen(b)[b].call("reset_offsets", name, topic_name, target)
                parts += [f"{b}:{t}/{q} -> {o}" for t, q, o in done]
            if not parts:
                raise EQueueError("no broker was chosen for the reset")
            notice = "offsets reset: " + ", ".join(parts)
        return RedirectResponse(f"/groups/{quote(name, safe='')}?{urlencode({'notice': notice})}", 303)

    async def dlq(request: Request) -> Response:
        name = request.path_params["group"]
        count = min(1000, int(request.query_params.get("count", "100")))
        answers, errors = answered(await per_broker("dlq_messages", name, 0, count))
        return page(request, "dlq.html", title=f"DLQ of {name}", name=name, dlq_topic=DLQ_PREFIX + name,
                    messages=[(b, m, preview(m.body)) for b, msgs in answers.items() for m in msgs],
                    notice=request.query_params.get("notice"), errors=errors)

    async def dlq_resend(request: Request) -> Response:
        name = request.path_params["group"]
        ids = (await _form(request)).get("msg_id", [])
        if not ids:
            raise EQueueError("choose at least one message to re-send")
        if cluster is None:
            n = await backend.call("resend_dlq", name, ids)
        else:  # each box is "broker msg_id": re-sent by the broker whose DLQ holds it
            by_broker: dict[str, list[str]] = {}
            for value in ids:
                b, _, msg_id = value.partition(" ")
                by_broker.setdefault(b, []).append(msg_id)
            n = 0
            for b, chosen_ids in by_broker.items():
                n += await cluster.chosen(b)[b].call("resend_dlq", name, chosen_ids)
        return RedirectResponse(f"/groups/{quote(name, safe='')}/dlq?"
                                f"{urlencode({'notice': f're-sent {n} messages to their topics'})}", 303)

    async def messages(request: Request) -> Response:
        q = request.query_params
        msg_id, topic_name, key = q.get("id", "").strip(), q.get("topic", "").strip(), q.get("key", "").strip()
        lookup: Any = backend if cluster is None else cluster.admin  # the cluster admin routes by id / fans out
        found: list[Any] = []
        searched = False
        if msg_id:
            searched = True
            found = [await _lookup(lookup, "get_message", msg_id)]
        elif topic_name and key:
            searched = True
            found = await _lookup(lookup, "find_by_key", topic_name, key, 32)
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
