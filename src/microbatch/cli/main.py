"""The ``microbatch`` command: ``demo`` and ``checkpoint show``."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="microbatch", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a demo pipeline on an embedded local Spark")
    demo.add_argument("--batches", type=int, default=5, help="batches to run (default 5)")
    demo.add_argument("--rows-per-batch", type=int, default=100_000)
    demo.add_argument("--checkpoint", default=None,
                      help="checkpoint directory (default: a new temporary one)")
    checkpoint = commands.add_parser("checkpoint", help="inspect a checkpoint")
    checkpoint_commands = checkpoint.add_subparsers(dest="checkpoint_command", required=True)
    show = checkpoint_commands.add_parser("show", help="print the query id and the batch logs")
    show.add_argument("path")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from microbatch.cli.demo import run_demo
        return run_demo(args.batches, args.rows_per_batch, args.checkpoint)
    from microbatch.cli.checkpoint import show_checkpoint
    return show_checkpoint(args.path)


if __name__ == "__main__":
    sys.exit(main())
