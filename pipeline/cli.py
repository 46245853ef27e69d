"""`tidewire pipeline run <job> [--master local[2]] [--lake DIR] [job options]`: the jobs' command line.

Jobs: aggregates (pipeline.jobs.aggregates), reports (pipeline.jobs.reports), alerts (pipeline.jobs.alerts),
sparkplug (pipeline.jobs.sparkplug).
`--lake` defaults to $TIDEWIRE_LAKE_DIR (the gateway's `lake_dir` setting). Under spark-submit, `--master` is
spark-submit's own option, and this one is ignored.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType, ModuleType

from tidewire.pipeline.jobs import aggregates, alerts, compact, reports, sparkplug
from tidewire.pipeline.spark import DEFAULT_MASTER, DEFAULT_SHUFFLE_PARTITIONS, spark_session
from tidewire.pipeline.window import positive_int

JOBS: dict[str, ModuleType] = {"aggregates": aggregates, "reports": reports, "alerts": alerts, "compact": compact,
                              "sparkplug": sparkplug}
LAKE_ENV = "TIDEWIRE_LAKE_DIR"


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--conf wants KEY=VALUE, got {text!r}")
    return key.strip(), value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidewire pipeline", description="PySpark jobs over the Tidewire lake.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a job")
    jobs = run.add_subparsers(dest="job", required=True, metavar="{" + ",".join(JOBS) + "}")
    for name, module in JOBS.items():
        p = jobs.add_parser(name, help=(module.__doc__ or "").splitlines()[0],
                            description=(module.__doc__ or "").splitlines()[0])
        p.add_argument("--master", default=None,
                       help=f"Spark master (default {DEFAULT_MASTER}; ignored under spark-submit)")
        p.add_argument("--lake", default=os.environ.get(LAKE_ENV),
                       help=f"the lake directory or URI (default ${LAKE_ENV})")
        p.add_argument("--shuffle-partitions", type=positive_int, default=DEFAULT_SHUFFLE_PARTITIONS,
                       help="spark.sql.shuffle.partitions")
        p.add_argument("--conf", type=_conf_pair, action="append", default=[], metavar="KEY=VALUE",
                       help="extra Spark configuration (repeatable)")
        module.add_arguments(p)
    return parser


def lake_location(lake: str) -> str:
    """A local path made absolute (the driver's and the executors' working directories differ); URIs as given."""
    return lake if "://" in lake else os.path.abspath(lake)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if not args.lake:
        parser.error(f"--lake is required (or set ${LAKE_ENV})")
    lake = lake_location(args.lake)
    # SIGTERM: a streaming run is asked to stop (it stops its query between polls and exits 0); a second
    # SIGTERM, or one during a batch job, unwinds like Ctrl-C.
    stop = threading.Event()
    args.stop = stop

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if args.job == "aggregates" and not stop.is_set():
            stop.set()
            return
        raise KeyboardInterrupt

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        spark = spark_session(args.master, app=f"tidewire-{args.job}", conf=dict(args.conf),
                              shuffle_partitions=args.shuffle_partitions)
        try:
            return int(JOBS[args.job].main_job(spark, lake, args))
        finally:
            spark.stop()
    except KeyboardInterrupt:
        print(f"{args.job}: interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
