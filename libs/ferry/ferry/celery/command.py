"""`celery ferry`: a `celery` subcommand that reports the Ferry transport and its namesrv.

It exists for its entry point (`celery.commands` in libs/ferry/pyproject.toml):
the `celery` command imports every such plugin at start, and importing this
module imports `ferry.celery`, which registers the `ferry://` scheme with kombu.
"""
from __future__ import annotations

import click

from ferry.celery import TRANSPORT_PATH  # importing ferry.celery registers ferry://
from ferry.celery.tracing import instrument

# Every `celery` process imports this plugin: its workers trace tasks that carry trace context.
instrument()


@click.command(name="ferry", help="Show the ferry:// transport and check the app's broker.")
@click.pass_context
def ferry(ctx: click.Context) -> None:
    from ferry import __version__
    app = getattr(ctx.obj, "app", None)
    url = app.conf.broker_url if app is not None else None
    click.echo(f"ferry {__version__}: kombu transport ferry:// -> {TRANSPORT_PATH}")
    if app is not None and url:
        click.echo(f"broker: {url}")
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
        click.echo("namesrv reachable")

