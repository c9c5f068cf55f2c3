"""The ``pyspark-kudu`` command line: ``pyspark-kudu <group> <verb> [options]``.

Verbs follow the ``kudu`` tool (DESIGN §6). Each command group registers itself in
:data:`COMMAND_GROUPS` with a function that adds its verbs to an ``argparse`` sub-parser
and sets ``func`` (returning the exit code) and ``verb_parser`` (itself, for ``--conf``)
on each verb. One module per group (STYLE 11):

* ``master run`` -- a standalone master process (here);
* ``cluster ksck``, ``cluster rebalance [--report_only]`` -- :mod:`.cli_cluster`;
* ``tserver list --columns=...`` -- :mod:`.cli_tserver`;
* ``table list | describe NAME | delete NAME`` -- :mod:`.cli_table`;
* ``locations show`` -- :mod:`.cli_locations`.

The operator verbs share their options, output formats and exit codes through
:mod:`.connect`: ``--master`` / ``--master-dir`` / ``--token-file`` / ``--timeout-s``,
``--format text|json|json_pretty``; exit 0 ok, 1 problems found (or no such table), 2 usage
error, 3 master unreachable. :func:`main` returns 2 for command-line errors instead of
raising ``SystemExit``.

Thread-safety: not applicable (process entry point).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType

from pyspark_kudu.errors import KuduError
from pyspark_kudu.tools import cli_cluster, cli_locations, cli_table, cli_tserver
from pyspark_kudu.tools.connect import TOKEN_ENV, read_token

__all__ = ["COMMAND_GROUPS", "TOKEN_ENV", "build_parser", "main"]


def _add_master_group(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from pyspark_kudu.master.server import DEFAULT_PEERS

    grp = sub.add_parser("master", help="master operations")
    verbs = grp.add_subparsers(dest="verb", metavar="VERB", required=True)
    run = verbs.add_parser(
        "run", help="run a standalone master (Raft + RPC over Arrow Flight)",
        description="Run one master of a master group until SIGTERM/SIGINT.")
    run.add_argument("--conf", help="file of 'option = value' lines (see conf/master.conf); "
                                    "command-line options override it")
    run.add_argument("--id", help="this master's id, one of the --peers ids (e.g. m1)")
    run.add_argument("--peers", default=DEFAULT_PEERS,
                     help=f"the master group as id=host:port,... (default {DEFAULT_PEERS})")
    run.add_argument("--data-dir", help="this master's directory (catalog log and metadata)")
    run.add_argument("--listen", help="host:port to serve on (default: this id's peer address)")
    run.add_argument("--join", action="store_true",
                     help="start empty and wait to be added to a running group (add_master)")
    run.add_argument("--token-file", help="file holding the shared-secret token; or set "
                                          f"${TOKEN_ENV}")
    run.add_argument("--tls-cert", help="serve TLS with this PEM certificate (with --tls-key "
                                        "and --tls-ca); or set $PYSPARK_KUDU_TLS_CERT")
    run.add_argument("--tls-key", help="the certificate's unencrypted PEM private key; or set "
                                       "$PYSPARK_KUDU_TLS_KEY")
    run.add_argument("--tls-ca", help="PEM CA certificate(s) that peers' certificates are "
                                      "verified against; or set $PYSPARK_KUDU_TLS_CA")
    run.add_argument("--fsync", default="fdatasync", choices=["fdatasync", "fsync", "none"],
                     help="WAL sync policy ('none' is for benchmarks only)")
    run.add_argument("--location-mapping-cmd",
                     help="Kudu's --location_mapping_cmd (split like a shell would, run "
                          "without one; the host is appended)")
    run.add_argument("--location-mapping-timeout-s", type=float, default=10.0,
                     help="kill the location mapping command after this many seconds and "
                          "refuse the registration (default 10)")
    run.add_argument("--allow-unauthenticated", action="store_true",
                     help="serve on a non-loopback --listen address without a token "
                          "(trusted networks only)")
    run.add_argument("--tick-ms", type=float, default=50.0, help="Raft tick (default 50 ms)")
    run.add_argument("--election-ticks", type=int, default=20,
                     help="election timeout in ticks, randomised up to twice (default 20)")
    run.add_argument("--op-timeout-s", type=float, default=10.0,
                     help="how long a DDL waits to commit before answering TimedOut")
    run.add_argument("--follower-unavailable-considered-failed-sec", type=float, default=300.0,
                     help="a tablet server unheard of for this long has its replicas replaced "
                          "elsewhere (Kudu's follower_unavailable_considered_failed_sec; "
                          "default 300)")
    run.add_argument("--log-level", default="INFO", help="Python logging level (default INFO)")
    run.set_defaults(func=_master_run, verb_parser=run)


COMMAND_GROUPS: dict[str, Callable[[argparse._SubParsersAction[argparse.ArgumentParser]],
                                   None]] = {
    "master": _add_master_group,
    "cluster": cli_cluster.add_group,
    "tserver": cli_tserver.add_group,
    "table": cli_table.add_group,
    "locations": cli_locations.add_group,
}
"""Command group name -> function adding its verbs (each verb sets ``func``)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyspark-kudu",
                                     description="pyspark-kudu command line tools")
    sub = parser.add_subparsers(dest="group", metavar="GROUP", required=True)
    for add in COMMAND_GROUPS.values():
        add(sub)
    return parser


def _read_conf(path: str) -> dict[str, str]:
    """``option = value`` lines; ``#`` starts a comment; option names as on the command line."""
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise SystemExit(f"{path}:{n}: expected 'option = value', got {line!r}")
            out[key.strip().lstrip("-").replace("-", "_")] = value.strip()
    return out


def _master_run(args: argparse.Namespace) -> int:
    from pyspark_kudu.master.catalog_replica import ReplicaOptions
    from pyspark_kudu.master.server import MasterServer, MasterServerConfig, parse_peers
    from pyspark_kudu.rpc.tls import CA_ENV, CERT_ENV, FLAG_NAMES, KEY_ENV, load_tls

    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.id or not args.data_dir:
        raise SystemExit("master run needs --id and --data-dir (in arguments or --conf)")
    token = read_token(args.token_file)
    tls = load_tls(args.tls_cert or os.environ.get(CERT_ENV),
                   args.tls_key or os.environ.get(KEY_ENV),
                   args.tls_ca or os.environ.get(CA_ENV), names=FLAG_NAMES)
    cfg = MasterServerConfig(
        id=args.id, peers=parse_peers(args.peers), data_dir=args.data_dir,
        listen=args.listen, token=token, join=bool(args.join), sync=args.fsync,
        location_mapping_cmd=args.location_mapping_cmd,
        location_mapping_timeout_s=float(args.location_mapping_timeout_s),
        allow_unauthenticated=bool(args.allow_unauthenticated), tls=tls,
        op_timeout_s=float(args.op_timeout_s),
        follower_unavailable_considered_failed_s=float(
            args.follower_unavailable_considered_failed_sec),
        replica=ReplicaOptions(tick_interval_s=float(args.tick_ms) / 1000.0,
                               election_ticks=int(args.election_ticks)),
    )
    server = MasterServer(cfg).start()

    def _stop(signum: int, frame: FrameType | None) -> None:
        server.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not server.wait(0.5):
        pass
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pyspark-kudu`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2, message printed)
        return e.code if isinstance(e.code, int) else 2
    conf = getattr(args, "conf", None)
    if conf:
        # Options from the file become the verb's defaults; the command line still wins.
        verb: argparse.ArgumentParser = args.verb_parser
        verb.set_defaults(**_typed(verb, _read_conf(conf)))
        args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except KuduError as e:
        print(f"pyspark-kudu: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _typed(verb: argparse.ArgumentParser, values: dict[str, str]) -> dict[str, object]:
    out: dict[str, object] = {}
    known = {a.dest: a for a in verb._actions}
    for k, v in values.items():
        a = known.get(k)
        if a is None:
            raise SystemExit(f"unknown option {k!r} in --conf file")
        if isinstance(a, argparse._StoreTrueAction):
            out[k] = v.lower() in ("1", "true", "yes", "on")
        else:
            out[k] = a.type(v) if callable(a.type) else v
    return out


if __name__ == "__main__":
    raise SystemExit(main())
