"""`ferry celery-bridge`: send each message of a topic to a Celery task (see ferry.celery.bridge).

The Celery app is `--app module:attribute` (the tasks' app: its broker and
routing), else one made here for `--broker` (env CELERY_BROKER_URL, default
`ferry://<namesrv>`: the tasks then travel on Ferry too). Runs until SIGTERM
or SIGINT, then commits what was sent and exits 0.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
from typing import Any

DEFAULT_APP_ATTRS = ("app", "celery")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bridge = sub.add_parser("celery-bridge", help="send each message of a topic as a Celery "
                                                  "task (task_id = message id)")
    bridge.add_argument("--topic", required=True)
    bridge.add_argument("--group", required=True, help="the bridge's consumer group")
    bridge.add_argument("--task", required=True, help="the Celery task's name, e.g. app.tasks.bill")
    bridge.add_argument("--app", default=None, metavar="MODULE[:ATTR]",
                        help="the Celery app to send through (default: one made for --broker)")
    bridge.add_argument("--broker", default=None,
                        help="Celery broker URL when no --app (env CELERY_BROKER_URL, default "
                             "ferry://<namesrv>)")
    bridge.add_argument("--queue", default=None, help="Celery queue to send to (default: the "
                                                      "app's routing)")
    bridge.add_argument("--from", dest="from_", default=None, choices=["earliest", "latest"],
                        help="where a group with no committed offset starts (default: the "
                             "group's consume_from in namesrv, else latest)")
    bridge.add_argument("--concurrency", type=int, default=8,
                        help="publishes in flight at once (default 8)")
    bridge.set_defaults(func=celery_bridge)


def load_app(spec: str | None, broker: str | None, namesrv: str) -> Any:
    """The Celery app named by `spec` ("module:attr" or "module"), else a new one for `broker`."""
    import ferry.celery  # noqa: F401 - registers ferry:// before an app connects
    if spec:
        module_name, _, attr = spec.partition(":")
        module = importlib.import_module(module_name)
        for name in ([attr] if attr else list(DEFAULT_APP_ATTRS)):
            app = getattr(module, name, None)
            if app is not None:
                return app
        raise ValueError(f"--app {spec}: no Celery app found (tried {attr or DEFAULT_APP_ATTRS})")
    from celery import Celery
    url = broker or os.environ.get("CELERY_BROKER_URL") or f"ferry://{namesrv.split(',')[0]}"
    return Celery("ferry-celery-bridge", broker=url)


async def celery_bridge(args: argparse.Namespace) -> int:
    from ferry.celery.bridge import Bridge, BridgeConfig
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                                                   "%(message)s")
    from ferry.celery.tracing import BRIDGE_SERVICE
    from ferry.telemetry import setup_tracing, tracing
    setup_tracing(BRIDGE_SERVICE, namesrv=args.namesrv)
    app = load_app(args.app, args.broker, args.namesrv)
    bridge = Bridge(app, BridgeConfig(topic=args.topic, group=args.group, task=args.task,
                                      namesrv=args.namesrv, auto_offset_reset=args.from_,
                                      concurrency=args.concurrency, queue=args.queue))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await bridge.run(stop)
    finally:
        await asyncio.to_thread(tracing().shutdown)  # flush the bridge's spans
    print(f"celery-bridge: {bridge.sent} tasks sent, {bridge.failed} publishes failed",
          flush=True)
    return 0
