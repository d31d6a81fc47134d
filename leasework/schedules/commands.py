"""``leasework schedules list|show|create|pause|resume|delete|trigger|backfill``: recurring
schedules through the api (:class:`leasework.client.Client`), printed for a person (a table,
the facts, a sentence per change) or, with ``--json``, as the api answered. Refusals are
printed by :func:`leasework.cli.main` from the api's problem document."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leasework.client import Client

ACTIONS = ("list", "show", "create", "pause", "resume", "delete", "trigger", "backfill")
OVERLAPS = ("allow", "skip", "buffer_one")
CATCH_UPS = ("skip", "latest", "all")


def add_parser(sub: Any) -> None:
    """The ``schedules`` command and its actions, on the CLI's subparsers."""
    p = sub.add_parser("schedules", help="list, show, create, pause, resume, delete, trigger "
                       "or backfill recurring schedules")  # fmt: skip
    actions = p.add_subparsers(dest="schedules_command", required=True, metavar="ACTION")
    a = actions.add_parser("list", help="every schedule: next fire, state, last tick, counts")
    a.add_argument("--limit", type=int, help="schedules per page (default 100, at most 200)")
    a.add_argument("--after", help="the name the previous page ended with")
    a.add_argument("--json", action="store_true", help="print the api's answer")
    a = actions.add_parser("show", help="one schedule and its latest ticks")
    a.add_argument("name")
    a.add_argument("--ticks", type=int, help="how many ticks (default 50, at most 500)")
    a.add_argument("--json", action="store_true", help="print the api's answer")
    a = actions.add_parser("create", help="create a schedule")
    a.add_argument("name")
    a.add_argument("type", help="the job type each tick runs")
    a.add_argument("cron", help="'*/5 * * * *' (five fields) or six with seconds first")
    a.add_argument("payload", nargs="?", default=None, help="the jobs' payload, JSON")
    a.add_argument("--timezone", help="an IANA name (default UTC)")
    a.add_argument("--overlap", choices=OVERLAPS, help="default allow")
    a.add_argument("--catch-up", choices=CATCH_UPS, help="default latest")
    a.add_argument("--catch-up-limit", type=int, help="with --catch-up all (default 1)")
    a.add_argument("--grace", type=int, dest="grace_seconds", help="seconds (default 60)")
    a.add_argument("--json", action="store_true", help="print the api's answer")
    for action, what in (
        ("pause", "pause a schedule: no tick fires until it is resumed"),
        ("resume", "resume a paused schedule from its first tick after now"),
        ("delete", "delete a schedule and its ticks (its jobs stay)"),
        ("trigger", "run a schedule once now, outside its calendar"),
    ):
        a = actions.add_parser(action, help=what)
        a.add_argument("name")
        a.add_argument("--json", action="store_true", help="print the api's answer")
    a = actions.add_parser(
        "backfill", help="run each tick of a past range that never fired (at most 1,000)"
    )
    a.add_argument("name")
    a.add_argument("--from", dest="since", required=True, help="RFC 3339, e.g. 2026-01-02T00:00Z")
    a.add_argument("--until", required=True, help="RFC 3339 (inclusive)")
    a.add_argument("--json", action="store_true", help="print the api's answer")


# ---------------------------------------------------------------- formatting (pure)


def when(value: str | None) -> str:
    """An RFC 3339 time as ``2026-01-02 03:04:05Z`` (UTC); ``-`` for none."""
    if not value:
        return "-"
    parsed = datetime.fromisoformat(value)
    text = parsed.strftime("%Y-%m-%d %H:%M:%S")
    return text + ("Z" if parsed.utcoffset() is not None and not parsed.utcoffset() else "")


def last_tick(tick: dict[str, Any] | None) -> str:
    if tick is None:
        return "none yet"
    if tick["outcome"] == "skipped":
        return f"{when(tick['nominal_at'])} skipped ({tick['reason']})"
    status = tick.get("job_status") or "pruned"
    return f"{when(tick['nominal_at'])} {tick['source']}: {status}"


def table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def list_lines(page: dict[str, Any]) -> list[str]:
    schedules = page["schedules"]
    if not schedules:
        return ["no schedules (create one: leasework schedules create NAME TYPE CRON)"]
    rows = [["NAME", "TYPE", "CRON", "ZONE", "STATE", "NEXT FIRE", "LAST TICK", "FIRED", "SKIPPED"]]
    for s in schedules:
        capped = "+" if s["counts_capped"] else ""
        rows.append(
            [
                s["name"],
                s["type"],
                s["cron"],
                s["timezone"],
                "paused" if s["paused"] else "active",
                when(s["next_fire_at"]),
                last_tick(s["last_tick"]),
                f"{s['fired']}{capped}",
                f"{s['skipped']}{capped}",
            ]
        )
    lines = table(rows)
    if any(s["counts_capped"] for s in schedules):
        lines.append(f"(+: counted over the latest {page['ticks_counted']} ticks)")
    if page.get("next_after"):
        lines.append(f"(more: leasework schedules list --after {page['next_after']})")
    return lines


def show_lines(s: dict[str, Any]) -> list[str]:
    payload = json.dumps(s["payload"], sort_keys=True)
    creator = f", by {s['declared_by']}" if s.get("declared_by") else ""
    counted = " (of its latest ticks)" if s["counts_capped"] else ""
    up_to = f" up to {s['catch_up_limit']}" if s["catch_up"] == "all" else ""
    state = "paused" if s["paused"] else f"active, next fire {when(s['next_fire_at'])}"
    lines = [
        f"schedule {s['name']} ({'declared by its app' if s['source'] == 'app' else 'created'}"
        f"{creator}, {when(s['created_at'])})",
        f"  job       {s['type']} {payload}",
        f"  calendar  {s['cron']} in {s['timezone']}",
        f"  policy    overlap {s['overlap']}, catch-up {s['catch_up']}"
        f"{up_to}, "
        f"grace {s['grace_seconds']} s",
        f"  state     {state}",
        f"  ticks     {s['fired']} fired, {s['skipped']} skipped{counted}",
    ]
    ticks = s.get("ticks") or []
    if not ticks:
        return [*lines, "no ticks yet"]
    rows = [["TICK (NOMINAL)", "OUTCOME", "SOURCE", "JOB", "JOB STATUS"]]
    for t in ticks:
        skipped = t["outcome"] == "skipped"
        rows.append(
            [
                when(t["nominal_at"]),
                f"skipped: {t['reason']}" if skipped else "fired",
                t["source"],
                t["job_id"] or "-",
                "-" if skipped else (t["job_status"] or "pruned"),
            ]
        )
    return [*lines, f"latest {len(ticks)} tick(s), newest first:", *table(rows)]


def change_lines(action: str, answer: dict[str, Any]) -> list[str]:
    name = answer.get("schedule") or answer.get("name")
    if action == "create":
        return [f"created schedule {name}: first fire {when(answer['next_fire_at'])}"]
    if action in ("pause", "resume"):
        done = "paused" if action == "pause" else "resumed"
        if not answer["changed"]:
            return [f"schedule {name} was {done} already; nothing changed"]
        nxt = "" if action == "pause" else f"; next fire {when(answer['next_fire_at'])}"
        return [f"{done} schedule {name}{nxt}"]
    if action == "trigger":
        return [f"triggered schedule {name}: job {answer['job_id']} (tick {answer['tick_at']})"]
    if action == "backfill":
        fired = answer["fired"]
        lines = [
            f"backfilled schedule {name} from {answer['from']} until {answer['until']}: "
            f"{answer['ticks']} tick(s) in range, {len(fired)} fired now, "
            f"{answer['already']} had fired before"
        ]
        return lines + [f"  {when(t['tick_at'])}  job {t['job_id']}" for t in fired]
    lines = [f"deleted schedule {name} and its ticks (its jobs stay)"]
    if answer.get("source") == "app":
        lines.append(
            f"  note: app {answer.get('declared_by') or ''} declares it; a process of that "
            "app stores it again when it starts, unless its code no longer declares it"
        )
    return lines


# ---------------------------------------------------------------- running


def call(client: Client, args: argparse.Namespace) -> dict[str, Any]:
    """The api's answer to the action ``args`` ask for."""
    action = args.schedules_command
    if action == "list":
        return client.schedules(limit=args.limit, after=args.after)
    if action == "show":
        return client.schedule(args.name, ticks=args.ticks)
    if action == "create":
        return client.create_schedule(
            args.name,
            args.type,
            args.cron,
            payload=args.payload,
            timezone=args.timezone,
            overlap=args.overlap,
            catch_up=args.catch_up,
            catch_up_limit=args.catch_up_limit,
            grace_seconds=args.grace_seconds,
        )
    if action == "backfill":
        return client.backfill_schedule(args.name, args.since, args.until)
    method = {
        "pause": client.pause_schedule,
        "resume": client.resume_schedule,
        "delete": client.delete_schedule,
        "trigger": client.trigger_schedule,
    }[action]
    return method(args.name)


def run(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.schedules_command == "create" and args.payload is not None:
        try:
            args.payload = json.loads(args.payload)
        except ValueError as exc:
            print(f"error: the payload is not JSON: {exc}", file=sys.stderr)
            return 2
    answer = call(client, args)
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True))
        return 0
    action = args.schedules_command
    if action == "list":
        lines = list_lines(answer)
    elif action == "show":
        lines = show_lines(answer)
    else:
        lines = change_lines(action, answer)
    print("\n".join(lines))
    return 0
