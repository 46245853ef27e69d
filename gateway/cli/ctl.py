"""`tidewire ctl`: operate a running node through its admin HTTP API (status, clients, kick, publish, retained
messages, bans). People get aligned tables; `--json` prints the API's own JSON for scripts.

Exit status: 0 done, 1 the API refused (its error text on stderr), 2 no connection or no token.
The token comes from `--token` / TIDEWIRE_API_TOKEN, else from the token file the node wrote
(`--token-file` / TIDEWIRE_API_TOKEN_FILE, default `<data_dir>/api_token`); it is never printed.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn
from urllib.parse import quote

import httpx
import typer

ctl_app = typer.Typer(add_completion=False, no_args_is_help=True,
                      help="Operate a running node through its admin API (http://HOST:18083).")
retained_app = typer.Typer(add_completion=False, help="Retained messages: list [FILTER], get TOPIC, delete TOPIC.")

DEFAULT_URL = "http://127.0.0.1:18083"
TOKEN_FILE_NAME = "api_token"
TIMEOUT = 10.0  # s per request: a node's API answers from memory or one store read
MAX_TOKEN_FILE = 4096  # bytes read from a token file (its first line is the token)
MAX_LIMIT = 1000  # the API's page size limit
EXIT_API = 1
EXIT_CONNECT = 2


class BanKind(StrEnum):
    """What a ban matches (the API's `as`)."""

    clientid = "clientid"
    username = "username"
    peerhost = "peerhost"


@dataclass(frozen=True, slots=True)
class CtlOptions:
    """The global options, resolved lazily: `--help` of a subcommand must work without a token."""

    url: str
    token: str | None
    token_file: Path | None
    json: bool


JsonFlag = Annotated[bool, typer.Option("--json", help="print the API's JSON")]


@ctl_app.callback()
def ctl_main(
    ctx: typer.Context,
    url: Annotated[str, typer.Option(envvar="TIDEWIRE_ADMIN_URL", help="the node's admin port")] = DEFAULT_URL,
    token: Annotated[str | None, typer.Option(envvar="TIDEWIRE_API_TOKEN", show_envvar=True,
                                              help="API token (prefer the env var: a flag shows in `ps`)")] = None,
    token_file: Annotated[Path | None, typer.Option(
        envvar="TIDEWIRE_API_TOKEN_FILE", help="file whose first line is the token; default <data_dir>/api_token "
        "(data_dir: TIDEWIRE_DATA_DIR or ./data)")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Operate a running node through its admin API."""
    ctx.obj = CtlOptions(url=url, token=token, token_file=token_file, json=json_out)


# -- plumbing -------------------------------------------------------------------------------------------------


def _fail(code: int, message: str) -> NoReturn:
    typer.echo(f"tidewire ctl: {message}", err=True)
    raise typer.Exit(code)


def _options(ctx: typer.Context, json_out: bool) -> CtlOptions:
    opts = ctx.find_object(CtlOptions)
    if opts is None:  # a command invoked without the group (never from the CLI)
        opts = CtlOptions(DEFAULT_URL, None, None, False)
    if json_out and not opts.json:
        opts = CtlOptions(opts.url, opts.token, opts.token_file, True)
    return opts


def default_token_file() -> Path:
    """`<data_dir>/api_token`, data_dir as the node's Settings default it (TIDEWIRE_DATA_DIR, else ./data)."""
    from tidewire.gateway.config import Settings  # here: pydantic-settings is a third of a command's start time

    data_dir = os.environ.get("TIDEWIRE_DATA_DIR") or Settings.model_fields["data_dir"].default
    return Path(data_dir) / TOKEN_FILE_NAME


def resolve_token(opts: CtlOptions) -> str:
    """The token from the option/env, else the token file's first line; exit 2 when there is none."""
    token = opts.token
    source = "--token"
    if not token:
        path = opts.token_file or default_token_file()
        source = str(path)
        try:
            with path.open("rb") as f:
                raw = f.read(MAX_TOKEN_FILE)
        except OSError as exc:
            _fail(EXIT_CONNECT, f"no API token: pass --token, set TIDEWIRE_API_TOKEN or use --token-file "
                                f"(cannot read {path}: {exc.strerror or exc})")
        lines = raw.decode("utf-8", "replace").splitlines()
        token = lines[0].strip() if lines else ""
    # An HTTP header carries printable ASCII only; say so without showing the token.
    if not token or not token.isascii() or not token.isprintable():
        _fail(EXIT_CONNECT, f"no usable API token in {source}")
    return token


def _error_text(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        if isinstance(body.get("error"), str):
            return str(body["error"])
        detail = body.get("detail")  # FastAPI's validation answer (422)
        if isinstance(detail, list):
            parts = [f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}"
                     for d in detail if isinstance(d, dict)]
            return "; ".join(parts) or "invalid request"
        if isinstance(detail, str):
            return detail
    return resp.text.strip()[:200] or resp.reason_phrase


def call(opts: CtlOptions, method: str, path: str, *, params: dict[str, Any] | None = None,
         body: dict[str, Any] | None = None) -> Any:
    """One API request: the decoded JSON answer (None for 204); exit 1 on an API error, 2 when unreachable."""
    token = resolve_token(opts)
    query = {k: v for k, v in (params or {}).items() if v is not None}
    try:
        with httpx.Client(base_url=opts.url, timeout=TIMEOUT, follow_redirects=False,
                          headers={"Authorization": f"Bearer {token}"}) as http:
            resp = http.request(method, path, params=query, json=body)
    except (httpx.TransportError, httpx.InvalidURL) as exc:
        _fail(EXIT_CONNECT, f"cannot reach {opts.url}: {exc or type(exc).__name__}")
    if resp.status_code >= 400:
        _fail(EXIT_API, f"{clean(_error_text(resp))} (HTTP {resp.status_code})")  # it may quote client input
    if resp.status_code == 204 or not resp.content:
        return None
    try:
        return resp.json()
    except ValueError:
        _fail(EXIT_API, f"the API answered HTTP {resp.status_code} with something that is not JSON")


def _seg(value: str) -> str:
    """One URL path segment; `/` too is escaped (client ids and ban targets may contain it)."""
    return quote(value, safe="")


def _topic_path(topic: str) -> str:
    return quote(topic, safe="/")


def _rows(answer: Any) -> list[dict[str, Any]]:
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        _fail(EXIT_API, "unexpected answer from the API (no data list)")
    return [row for row in data if isinstance(row, dict)]


def _printed_json(opts: CtlOptions, answer: Any) -> bool:
    """With --json: print the API's answer as it came (nothing for an empty 204) and say so."""
    if opts.json and answer is not None:
        typer.echo(json.dumps(answer, indent=2, ensure_ascii=False))
    return opts.json


def clean(value: Any) -> str:
    """Text safe for a terminal: client ids and topics are chosen by clients, so control characters (escape
    sequences) are shown escaped rather than interpreted."""
    text = "-" if value is None else str(value)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """Left-aligned columns two spaces apart (trailing blanks trimmed)."""
    cells = [headers, *([clean(v) for v in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def when(epoch: Any) -> str:
    if not isinstance(epoch, int | float) or isinstance(epoch, bool):
        return "-" if epoch is None else str(epoch)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float):
        return str(seconds)
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [f"{n}{unit}" for n, unit in ((d, "d"), (h, "h"), (m, "m")) if n]
    return " ".join([*parts, f"{s}s"])


def _meta_line(answer: Any, shown: int, noun: str) -> str:
    """The footer: `3 clients`, or `100 of 2345 clients (...)` when the API has more pages."""
    meta = answer.get("meta") if isinstance(answer, dict) else None
    total = meta.get("count") if isinstance(meta, dict) else None
    if isinstance(total, int) and total > shown:
        return f"{shown} of {total} {noun}s (use --page/--limit for more)"
    return f"{shown} {noun}{'' if shown == 1 else 's'}"


# -- commands ---------------------------------------------------------------------------------------------------


@ctl_app.command("status")
def status_command(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """The node: id, version, store, uptime, counters, cluster members."""
    opts = _options(ctx, json_out)
    s = call(opts, "GET", "/api/v1/status")
    if _printed_json(opts, s):
        return
    if not isinstance(s, dict):
        _fail(EXIT_API, "unexpected answer from the API")
    pairs = [("node", s.get("node_id")), ("version", s.get("version")), ("store", s.get("store")),
             ("uptime", duration(s.get("uptime_s"))), ("draining", "yes" if s.get("draining") else "no")]
    pairs += [(k, s.get(k)) for k in ("connections", "sessions_online", "subscriptions", "messages_in",
                                      "messages_out", "bytes_in", "bytes_out", "dropped")]
    cluster = s.get("cluster")
    members = cluster.get("members") if isinstance(cluster, dict) else None
    if isinstance(cluster, dict) and isinstance(members, list):
        pairs.append(("cluster", f"{len(members)} members, epoch {cluster.get('epoch')}"))
        pairs += [("  member", f"{m.get('node_id')} {m.get('address')}") for m in members if isinstance(m, dict)]
    else:
        pairs.append(("cluster", "no"))
    width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        typer.echo(f"{key.ljust(width)}  {clean(value)}")


@ctl_app.command("clients")
def clients_command(
    ctx: typer.Context,
    client_id: Annotated[str | None, typer.Option("--client-id", help="client id contains this")] = None,
    username: Annotated[str | None, typer.Option(help="user name contains this")] = None,
    peer: Annotated[str | None, typer.Option(help="peer address contains this")] = None,
    limit: Annotated[int, typer.Option(min=1, max=MAX_LIMIT, help="rows per page")] = 100,
    page: Annotated[int, typer.Option(min=1, help="page number")] = 1,
    json_out: JsonFlag = False,
) -> None:
    """Clients connected to this node."""
    opts = _options(ctx, json_out)
    answer = call(opts, "GET", "/api/v1/clients", params={"client_id": client_id, "username": username,
                                                          "peer": peer, "limit": limit, "page": page})
    if _printed_json(opts, answer):
        return
    rows = _rows(answer)
    typer.echo(table(["CLIENT_ID", "USERNAME", "PEER", "PROTOCOL", "VER", "KEEPALIVE", "SUBS", "INFLIGHT",
                      "CONNECTED"],
                     [[c.get("client_id"), c.get("username"), c.get("peer"), c.get("protocol"), c.get("proto_ver"),
                       c.get("keepalive"), c.get("subscriptions"), c.get("inflight"), when(c.get("connected_at"))]
                      for c in rows]))
    typer.echo(_meta_line(answer, len(rows), "client"))


@ctl_app.command("kick")
def kick_command(ctx: typer.Context, client_id: str, json_out: JsonFlag = False) -> None:
    """Disconnect a client (MQTT 5: DISCONNECT 0x98 administrative action)."""
    opts = _options(ctx, json_out)
    answer = call(opts, "DELETE", f"/api/v1/clients/{_seg(client_id)}")
    if _printed_json(opts, answer):
        return
    typer.echo(f"kicked {clean(client_id)}")


@ctl_app.command("publish")
def publish_command(
    ctx: typer.Context,
    topic: str,
    payload: str,
    qos: Annotated[int, typer.Option(min=0, max=2, help="0, 1 or 2")] = 0,
    retain: Annotated[bool, typer.Option("--retain", help="keep as the topic's retained message")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Publish PAYLOAD (text) to TOPIC; with QoS > 0 returns once it is stored."""
    opts = _options(ctx, json_out)
    answer = call(opts, "POST", "/api/v1/publish", body={"topic": topic, "payload": payload, "encoding": "plain",
                                                         "qos": qos, "retain": retain})
    if _printed_json(opts, answer):
        return
    retained = ", retained" if retain else ""
    typer.echo(f"published {len(payload.encode())} bytes to {clean(topic)} (qos {qos}{retained})")


def _list_retained(opts: CtlOptions, topic_filter: str, limit: int, page: int) -> None:
    answer = call(opts, "GET", "/api/v1/retained", params={"topic": topic_filter, "limit": limit, "page": page})
    if _printed_json(opts, answer):
        return
    rows = _rows(answer)
    typer.echo(table(["TOPIC", "QOS", "BYTES"], [[r.get("topic"), r.get("qos"), r.get("payload_size")]
                                                 for r in rows]))
    typer.echo(_meta_line(answer, len(rows), "retained message"))


FilterArg = Annotated[str, typer.Argument(help="topic filter (wildcards allowed)")]
LimitOpt = Annotated[int, typer.Option(min=1, max=MAX_LIMIT, help="rows per page")]
PageOpt = Annotated[int, typer.Option(min=1, help="page number")]


@retained_app.callback(invoke_without_command=True)
def retained_main(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """Retained messages; without a subcommand, list them all."""
    if ctx.invoked_subcommand is None:
        _list_retained(_options(ctx, json_out), "#", 100, 1)


@retained_app.command("list")
def retained_list_command(ctx: typer.Context, topic_filter: FilterArg = "#", limit: LimitOpt = 100,
                          page: PageOpt = 1, json_out: JsonFlag = False) -> None:
    """Retained messages whose topic matches FILTER (default #)."""
    _list_retained(_options(ctx, json_out), topic_filter, limit, page)


def _payload_text(encoded: Any) -> str:
    if not isinstance(encoded, str):
        return "-"
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return encoded
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return f"(binary, base64) {encoded}"
    return text if text.isprintable() else f"(base64) {encoded}"


@retained_app.command("get")
def retained_get_command(ctx: typer.Context, topic: str, json_out: JsonFlag = False) -> None:
    """The retained message of TOPIC."""
    opts = _options(ctx, json_out)
    answer = call(opts, "GET", f"/api/v1/retained/{_topic_path(topic)}")
    if _printed_json(opts, answer):
        return
    if not isinstance(answer, dict):
        _fail(EXIT_API, "unexpected answer from the API")
    typer.echo(f"topic    {clean(answer.get('topic'))}\nqos      {clean(answer.get('qos'))}\n"
               f"bytes    {clean(answer.get('payload_size'))}\npayload  {clean(_payload_text(answer.get('payload')))}")


@retained_app.command("delete")
def retained_delete_command(ctx: typer.Context, topic: str, json_out: JsonFlag = False) -> None:
    """Delete the retained message of TOPIC."""
    opts = _options(ctx, json_out)
    answer = call(opts, "DELETE", f"/api/v1/retained/{_topic_path(topic)}")
    if _printed_json(opts, answer):
        return
    typer.echo(f"deleted the retained message of {clean(topic)}")


ctl_app.add_typer(retained_app, name="retained")


@ctl_app.command("ban")
def ban_command(
    ctx: typer.Context,
    kind: Annotated[BanKind, typer.Argument(metavar="AS", case_sensitive=False,
                                                      help="clientid, username or peerhost")],
    who: Annotated[str, typer.Argument(metavar="WHO", help="client id, user name, or address/CIDR")],
    duration_s: Annotated[float | None, typer.Option("--duration", min=0.001, help="s; default: for ever")] = None,
    reason: Annotated[str | None, typer.Option(help="kept with the ban")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Refuse connections matching WHO (and kick those online on the node)."""
    opts = _options(ctx, json_out)
    body: dict[str, Any] = {"as": kind.value, "who": who}
    if reason is not None:
        body["reason"] = reason
    if duration_s is not None:
        body["duration"] = duration_s
    answer = call(opts, "POST", "/api/v1/banned", body=body)
    if _printed_json(opts, answer):
        return
    info = answer if isinstance(answer, dict) else {}
    until = info.get("until")
    line = f"banned {kind.value} {clean(info.get('who', who))} " + (f"until {when(until)}" if until is not None
                                                                     else "for ever")
    if isinstance(info.get("kicked"), int) and info["kicked"]:
        line += f" (kicked {info['kicked']} online)"
    typer.echo(line)


@ctl_app.command("unban")
def unban_command(
    ctx: typer.Context,
    kind: Annotated[BanKind, typer.Argument(metavar="AS", case_sensitive=False,
                                                      help="clientid, username or peerhost")],
    who: Annotated[str, typer.Argument(metavar="WHO")],
    json_out: JsonFlag = False,
) -> None:
    """Lift a ban."""
    opts = _options(ctx, json_out)
    answer = call(opts, "DELETE", f"/api/v1/banned/{kind.value}/{_seg(who)}")
    if _printed_json(opts, answer):
        return
    typer.echo(f"unbanned {kind.value} {clean(who)}")


@ctl_app.command("bans")
def bans_command(ctx: typer.Context, limit: LimitOpt = 100, page: PageOpt = 1, json_out: JsonFlag = False) -> None:
    """Every ban in force."""
    opts = _options(ctx, json_out)
    answer = call(opts, "GET", "/api/v1/banned", params={"limit": limit, "page": page})
    if _printed_json(opts, answer):
        return
    rows = _rows(answer)
    typer.echo(table(["AS", "WHO", "REASON", "AT", "UNTIL"],
                     [[b.get("as"), b.get("who"), b.get("reason") or "-", when(b.get("at")),
                       when(b.get("until")) if b.get("until") is not None else "for ever"] for b in rows]))
    typer.echo(_meta_line(answer, len(rows), "ban"))


@ctl_app.command("bridges")
def bridges_command(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """The node's MQTT bridges: state, address, messages out and in, and the lag of what waits to go out."""
    opts = _options(ctx, json_out)
    answer = call(opts, "GET", "/api/v1/bridges")
    if _printed_json(opts, answer):
        return
    rows = _rows(answer)
    typer.echo(table(["NAME", "STATE", "ADDRESS", "SENT", "ACKED", "REDELIVERED", "RECEIVED", "STORED", "DENIED",
                      "LAG", "LAG_AGE", "LAST_ERROR"],
                     [[b.get("name"), b.get("state"), b.get("address"), b.get("sent"), b.get("acked"),
                       b.get("redelivered"), b.get("received"), b.get("stored"), b.get("denied"),
                       b.get("lag_messages"), duration(b.get("lag_seconds")) if b.get("lag_seconds") else "-",
                       b.get("last_error") or "-"] for b in rows]))


@ctl_app.command("rules")
def rules_command(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """The rules and what each did on this node: matched, sent, failed, dead-lettered."""
    opts = _options(ctx, json_out)
    answer = call(opts, "GET", "/api/v1/rules")
    if _printed_json(opts, answer):
        return
    rows = _rows(answer)
    typer.echo(table(["NAME", "ENABLED", "ACTION", "MATCHED", "SENT", "FAILED", "DEAD_LETTERED", "LAST_ERROR", "SQL"],
                     [[r.get("name"), "yes" if r.get("enabled") else "no", (r.get("action") or {}).get("type"),
                       *((r.get("counts") or {}).get(k) for k in ("matched", "sent", "failed", "dead_lettered")),
                       r.get("last_error") or "-", r.get("sql")] for r in rows]))
