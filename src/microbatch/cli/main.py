"""The ``microbatch`` command.

    microbatch demo                                  a pipeline on an embedded local Spark
    microbatch ui CKPT [CKPT ...] [--port 4050]      the dashboard of checkpoints, read-only
    microbatch watch CKPT [CKPT ...]                 a live line per checkpoint's query
    microbatch monitoring grafana|alerts             the Grafana dashboard or the Prometheus
                                                     alert rules over /metrics, printed
    microbatch checkpoint show CKPT                  the batches and their offsets
    microbatch checkpoint verify CKPT [--output OUT] every file read; non-zero exit on damage
    microbatch checkpoint explain CKPT N             sources, offsets, watermark, confs, plan of batch N
    microbatch checkpoint diff CKPT_A CKPT_B         how two checkpoints' batches differ
    microbatch checkpoint rollback CKPT --to-batch N make batch N the last committed one
    microbatch checkpoint state repartition CKPT --partitions N
                                                     rewrite the state into N partitions
    microbatch checkpoint convert CKPT --to spark [--state-provider hdfs|rocksdb]
                                                     make the checkpoint one Spark's engine resumes

Checkpoints may be local paths or ``s3://``/``s3a://`` locations; ``--conf key=value``
gives Spark's settings for them (``spark.hadoop.fs.s3a.endpoint``, keys, ...), as a job
would. Commands that write (``rollback``, ``state repartition``, ``convert``) refuse a checkpoint whose
query runs, and take its run lease while they work.
"""
from __future__ import annotations

import argparse
import sys


#: what ``microbatch monitoring`` prints (microbatch/ops/monitoring/, package data)
MONITORING_FILES = {"grafana": "grafana-dashboard.json", "alerts": "prometheus-alerts.yml"}


def _settings(pairs: list[str]) -> dict[str, str]:
    settings = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--conf takes key=value, got '{pair}'")
        settings[key.strip()] = value
    return settings


def _conf_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the checkpoint's storage (repeatable)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="microbatch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a demo pipeline on an embedded local Spark")
    demo.add_argument("--batches", type=int, default=5, help="batches to run (default 5)")
    demo.add_argument("--rows-per-batch", type=int, default=100_000)
    demo.add_argument("--checkpoint", default=None,
                      help="checkpoint directory (default: a new temporary one)")

    ui = commands.add_parser("ui", help="serve the dashboard of checkpoints (read-only)")
    ui.add_argument("checkpoints", nargs="+", metavar="CKPT")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=4050, help="0: a free port (default 4050)")
    _conf_option(ui)

    watch = commands.add_parser("watch", help="a live line per checkpoint's query")
    watch.add_argument("checkpoints", nargs="+", metavar="CKPT")
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between reads")
    watch.add_argument("--count", type=int, default=None, help="stop after this many reads")
    _conf_option(watch)

    monitoring = commands.add_parser("monitoring", help="print the Grafana dashboard or the Prometheus alert rules")
    monitoring.add_argument("what", choices=sorted(MONITORING_FILES),
                            help="grafana: a dashboard JSON to import; alerts: a rules file for Prometheus")

    checkpoint = commands.add_parser("checkpoint", help="inspect, verify and repair a checkpoint")
    checkpoint_commands = checkpoint.add_subparsers(dest="checkpoint_command", required=True)
    show = checkpoint_commands.add_parser("show", help="print the query id and the batch logs")
    show.add_argument("path")
    verify = checkpoint_commands.add_parser("verify", help="read every file; exit 1 on damage")
    verify.add_argument("path")
    verify.add_argument("--output", help="the file sink's output (default: from the progress log)")
    explain = checkpoint_commands.add_parser("explain", help="what batch N read and how it ran")
    explain.add_argument("path")
    explain.add_argument("batch", type=int)
    diff = checkpoint_commands.add_parser("diff", help="how two checkpoints' batches differ")
    diff.add_argument("a")
    diff.add_argument("b")
    rollback = checkpoint_commands.add_parser("rollback", help="make batch N the last committed one")
    rollback.add_argument("path")
    rollback.add_argument("--to-batch", type=int, required=True, dest="to_batch")
    rollback.add_argument("--output", help="the file sink's output (default: from the progress log)")
    state = checkpoint_commands.add_parser("state", help="the state of a checkpoint")
    state_commands = state.add_subparsers(dest="state_command", required=True)
    repartition = state_commands.add_parser("repartition", help="rewrite the state into N partitions")
    repartition.add_argument("path")
    repartition.add_argument("--partitions", type=int, required=True)
    repartition.add_argument("--skip-uncommitted-batch", action="store_true",
                             help="repartition the last committed batch's state even if a later "
                                  "batch failed (its output may then be written twice)")
    convert = checkpoint_commands.add_parser(
        "convert", help="make the checkpoint one Spark's engine resumes, with its state (docs/porting.md)")
    convert.add_argument("path")
    convert.add_argument("--to", choices=["spark"], required=True,
                         help="the engine to resume on: spark (Spark's own engine)")
    convert.add_argument("--state-provider", choices=["hdfs", "rocksdb"], default=None,
                         help="Spark's state store provider to write the state for (default: the one "
                              "matching the checkpoint's; rocksdb for a transformWithState)")
    for sub in (show, verify, explain, diff, rollback, repartition, convert):
        _conf_option(sub)
    args = parser.parse_args(argv)

    if args.command == "demo":
        from microbatch.cli.demo import run_demo
        return run_demo(args.batches, args.rows_per_batch, args.checkpoint)
    if args.command == "monitoring":
        from importlib.resources import files
        sys.stdout.write(files("microbatch.ops").joinpath("monitoring", MONITORING_FILES[args.what]).read_text())
        return 0
    settings = _settings(args.conf)
    if args.command == "ui":
        from microbatch.ops.dashboard import Dashboard
        from microbatch.ops.history import CheckpointQueries
        dashboard = Dashboard(CheckpointQueries(args.checkpoints, settings), args.host, args.port,
                              title="checkpoints").start()
        print(f"The dashboard of {len(args.checkpoints)} checkpoint(s) is at {dashboard.url} "
              "(Ctrl-C stops it)", flush=True)
        dashboard.serve_forever()
        return 0
    if args.command == "watch":
        from microbatch.cli.checkpoint import watch_checkpoints
        return watch_checkpoints(args.checkpoints, settings, args.interval, args.count)
    from microbatch.cli import checkpoint as tools
    if args.checkpoint_command == "show":
        return tools.show_checkpoint(args.path, settings)
    if args.checkpoint_command == "verify":
        return tools.verify_checkpoint(args.path, settings, args.output)
    if args.checkpoint_command == "explain":
        return tools.explain_batch(args.path, args.batch, settings)
    if args.checkpoint_command == "diff":
        return tools.diff_checkpoints(args.a, args.b, settings)
    if args.checkpoint_command == "rollback":
        return tools.rollback_checkpoint(args.path, args.to_batch, settings, args.output)
    if args.checkpoint_command == "convert":
        return tools.convert_checkpoint(args.path, settings, args.state_provider)
    return tools.repartition_state(args.path, args.partitions, settings, not args.skip_uncommitted_batch)


if __name__ == "__main__":
    sys.exit(main())
