"""How every command reaches its log: the options for object storage and tiering that
all commands take, and opening the log a command names with them."""

from __future__ import annotations

import argparse
from typing import Any

from .. import open as open_log_at
from ..api import AbstractLog as Log
from .args import storage_option

__all__ = ["log_options", "open_log"]


def log_options() -> argparse.ArgumentParser:
    """Options every command takes to reach a log on object storage (an argparse parent
    parser)."""
    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group("object storage")
    group.add_argument(
        "--backend",
        choices=("segments", "objects"),
        help="force a backend (a path or file:// URL opens segments unless 'objects')",
    )
    group.add_argument(
        "--sequencer", metavar="URL", help="the log's sequencer, e.g. sqlite:///path/meta.db"
    )
    group.add_argument(
        "--storage-option",
        metavar="KEY=VALUE",
        type=storage_option,
        action="append",
        default=[],
        help="an fsspec storage option (repeatable), e.g. anon=true or "
        'client_kwargs={"endpoint_url": "http://127.0.0.1:9000"}',
    )
    tiering = options.add_argument_group("tiering (local logs)")
    tiering.add_argument(
        "--tier-url",
        metavar="URL",
        help="where the log's closed segments are tiered, e.g. s3://bucket/prefix; recorded "
        "in the log the first time, so later commands need not repeat it",
    )
    tiering.add_argument(
        "--tier-storage-option",
        metavar="KEY=VALUE",
        type=storage_option,
        action="append",
        default=[],
        help="an fsspec storage option of the tier (repeatable; never recorded)",
    )
    group.add_argument(
        "--producer-expiration-ms",
        metavar="MS",
        type=int,
        help="forget producers (writers) idle this long when this command maintains the "
        "log (default 86400000, a day; give the value your applications use)",
    )
    maintenance = options.add_argument_group("automatic maintenance")
    maintenance.add_argument(
        "--maintenance",
        choices=("auto", "off"),
        help="whether a command that writes (produce, create) takes part in the log's "
        "automatic maintenance while it runs (default: auto)",
    )
    return options


def open_log(args: argparse.Namespace, *, create: bool) -> Log:
    """Open the log a command names, with the connection options it was given."""
    options: dict[str, Any] = {"create": create}
    if args.backend is not None:
        options["backend"] = args.backend
    if args.sequencer is not None:
        options["sequencer"] = args.sequencer
    if args.storage_option:
        options["storage_options"] = dict(args.storage_option)
    if args.tier_url is not None:
        options["tier_url"] = args.tier_url
    if args.tier_storage_option:
        options["tier_storage_options"] = dict(args.tier_storage_option)
    if args.maintenance is not None:
        options["maintenance"] = args.maintenance
    if args.producer_expiration_ms is not None:
        options["producer_expiration_ms"] = args.producer_expiration_ms
    return open_log_at(args.url, **options)
