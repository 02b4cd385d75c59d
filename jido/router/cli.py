"""``jido router``: the flags (generated from RouterConfig) and the server loop."""
from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from jido.router.app import create_router_app
from jido.router.config import RouterConfig
from jido.utils.cli_args import add_dataclass_arguments, dataclass_kwargs
from jido.utils.drain_signals import drained_signals_exit_cleanly

logger = logging.getLogger("jido")


def router_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jido router", description="An OpenAI-compatible proxy in front of prefill (kv_producer) and decode "
        "(kv_consumer) instances, or a data-parallel, cache-aware balancer over --decode instances alone.")
    add_dataclass_arguments(parser, RouterConfig)
    return parser


def router_main(argv: list[str]) -> int:
    args = router_parser().parse_args(argv)
    try:
        config = RouterConfig(**dataclass_kwargs(args, RouterConfig))
    except ValueError as exc:
        print(f"jido router: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(create_router_app(config), host=config.host, port=config.port,
                                           log_level="warning", lifespan="on"))
    try:
        with drained_signals_exit_cleanly():
            server.run()
    except ValueError as exc:  # instances that cannot exchange KV, found when the router starts
        print(f"jido router: error: {exc}", file=sys.stderr)
        return 2
    return 0 if server.started else 2
