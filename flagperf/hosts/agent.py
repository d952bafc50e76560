"""The host side of an SSH host: small commands the controller runs over SSH, so that process groups,
timeouts and logs on a remote host behave exactly as on the local one (they share LocalHost's code).

    python -m flagperf.hosts.agent run --timeout 60 --log LOG [--pid-file P] [--inventory-env-stdin] -- ARGV...
        stdout: the command's output (also appended to LOG); stderr, last line: {"exit_code", "timed_out"}.
        The command is killed when stdin closes: a lost SSH connection never leaves a case running.
    python -m flagperf.hosts.agent spawn --log LOG [--inventory-env-stdin] -- ARGV...   -> {"pid": N} (detached)
    python -m flagperf.hosts.agent terminate --pid N --grace S   -> {"exit_code": null}
    python -m flagperf.hosts.agent alive --pid N                 -> exit 0 if running, 1 if not
    python -m flagperf.hosts.agent disk-free PATH                -> {"free": bytes}
    python -m flagperf.hosts.agent keepalive                     -> {"pid": N}, then waits for stdin to close
    python -m flagperf.hosts.agent info                          -> {"uid", "gid", "time", "hostname"}
    python -m flagperf.hosts.agent describe-paths [--scan=P]... [--tree=ROOT] [--mounted=T]... [--bind=S:T]... -- P...
        -> {"paths": {PATH: {"path": resolved, "kind"}}}; a folder among the --scan ones also has "links_out" (of
        the tree ROOT, the project a container has at that path, where the folder resolves into it; a link to a
        place under a --mounted or --bind one, the container's other mounts, is none of them), and "loops" where
        some of those open nowhere (ELOOP)
    python -m flagperf.hosts.agent exec-with-env FILE -- ARGV... -> ARGV, with FILE's variables (a JSON object)
        in its environment: a container's start, so that they are in no container config (docker inspect)

--inventory-env-stdin: the first line of stdin is a JSON object, the variables the inventory gives the host's
cases. They come through the SSH channel, never on a command line (anyone on the host can read those in ``ps``)
nor in this agent's own environment, and reach the command as they are, like a local host's, not through the
allow-list that keeps the rest of the agent's environment from the case.

Only the standard library and flagperf.hosts.local are imported: it must start fast (no torch).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

STATUS_PREFIX = "flagperf-hostagent-status "


def _say(obj: dict[str, object], stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    stream.write(json.dumps(obj) + "\n")
    stream.flush()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def inventory_env(from_stdin: bool) -> dict[str, str]:
    """The inventory's variables, from the first line of stdin when the controller sends them."""
    if not from_stdin:
        return {}
    env = json.loads(sys.stdin.buffer.readline() or b"{}")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise SystemExit("flagperf.hosts.agent: --inventory-env-stdin: the first line is no JSON object of strings")
    return env


def cmd_run(args: argparse.Namespace) -> int:
    from flagperf.hosts.local import LocalHost

    host = LocalHost(work_root=Path(args.log).parent, env=inventory_env(args.inventory_env_stdin))

    def watch_stdin() -> None:
        # The controller holds our stdin open for as long as it watches; EOF means it is gone.
        while sys.stdin.buffer.read(4096):
            pass
        os.kill(os.getpid(), signal.SIGINT)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, interrupt)
    if not args.ignore_stdin:
        threading.Thread(target=watch_stdin, daemon=True).start()
    try:
        result = host.run(args.argv, timeout=args.timeout, log_path=Path(args.log),
                          on_line=lambda line: (sys.stdout.write(line + "\n"), sys.stdout.flush()),
                          pid_file=Path(args.pid_file) if args.pid_file else None)
    except KeyboardInterrupt:  # LocalHost.run killed the process group before re-raising
        sys.stderr.write(STATUS_PREFIX + json.dumps({"exit_code": None, "timed_out": False}) + "\n")
        return 1
    sys.stderr.write(STATUS_PREFIX + json.dumps({"exit_code": result.exit_code, "timed_out": result.timed_out})
                     + "\n")
    sys.stderr.flush()
    return 0


def cmd_spawn(args: argparse.Namespace) -> int:
    from flagperf.hosts.local import LocalHost

    host = LocalHost(work_root=Path(args.log).parent, env=inventory_env(args.inventory_env_stdin))
    proc = host.spawn(args.argv, log_path=Path(args.log))
    _say({"pid": proc.pid})
    return 0


def cmd_terminate(args: argparse.Namespace) -> int:
    """SIGTERM the process group, SIGKILL after the grace period (the process is not our child: no exit code)."""
    for sig, wait in ((signal.SIGTERM, args.grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(args.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.monotonic() + wait
        while _alive(args.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _alive(args.pid):
            break
    _say({"exit_code": None, "running": _alive(args.pid)})
    return 0


def cmd_alive(args: argparse.Namespace) -> int:
    return 0 if _alive(args.pid) else 1


def cmd_disk_free(args: argparse.Namespace) -> int:
    import shutil

    probe = Path(args.path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    _say({"free": shutil.disk_usage(probe).free, "at": str(probe)})
    return 0


def cmd_work_root(args: argparse.Namespace) -> int:
    from flagperf.hosts.local import private_folder_problem

    _say({"problem": private_folder_problem(Path(args.path), strict=args.strict)})
    return 0


def cmd_keepalive(args: argparse.Namespace) -> int:
    _say({"pid": os.getpid()})
    while sys.stdin.buffer.read(4096):
        pass
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    _say({"uid": os.getuid(), "gid": os.getgid(), "time": time.time(), "hostname": socket.gethostname(),
          "python": sys.executable})
    return 0


def cmd_describe_paths(args: argparse.Namespace) -> int:
    from flagperf.hosts.local import describe_paths

    _say({"paths": describe_paths(args.paths, args.scan, args.tree, args.mounted)})
    return 0


def cmd_exec_with_env(args: argparse.Namespace) -> int:
    env = json.loads(Path(args.file).read_text(encoding="utf-8"))
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise SystemExit(f"flagperf.hosts.agent: {args.file}: no JSON object of strings")
    os.environ.update(env)
    os.execvp(args.argv[0], args.argv)  # the same process: the container's signals and exit code are argv's


def main(argv: list[str] | None = None) -> int:
    # No abbreviations: a later option must never be read as an older one by an older agent (--bind, --mounted).
    parser = argparse.ArgumentParser(prog="python -m flagperf.hosts.agent", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--timeout", type=float, required=True)
    run.add_argument("--log", required=True)
    run.add_argument("--pid-file")
    run.add_argument("--ignore-stdin", action="store_true")
    run.add_argument("--inventory-env-stdin", action="store_true", help="the inventory's variables: stdin's first "
                     "line, a JSON object")
    run.add_argument("argv", nargs="+")
    run.set_defaults(func=cmd_run)
    spawn = sub.add_parser("spawn")
    spawn.add_argument("--log", required=True)
    spawn.add_argument("--inventory-env-stdin", action="store_true", help="the inventory's variables: stdin's "
                       "first line, a JSON object")
    spawn.add_argument("argv", nargs="+")
    spawn.set_defaults(func=cmd_spawn)
    term = sub.add_parser("terminate")
    term.add_argument("--pid", type=int, required=True)
    term.add_argument("--grace", type=float, default=10.0)
    term.set_defaults(func=cmd_terminate)
    alive = sub.add_parser("alive")
    alive.add_argument("--pid", type=int, required=True)
    alive.set_defaults(func=cmd_alive)
    disk = sub.add_parser("disk-free")
    disk.add_argument("path")
    disk.set_defaults(func=cmd_disk_free)
    work = sub.add_parser("work-root")
    work.add_argument("path")
    work.add_argument("--strict", action="store_true")
    work.set_defaults(func=cmd_work_root)
    sub.add_parser("keepalive").set_defaults(func=cmd_keepalive)
    sub.add_parser("info").set_defaults(func=cmd_info)
    described = sub.add_parser("describe-paths")
    described.add_argument("--scan", action="append", default=[], help="a folder among PATHs whose links that "
                           "leave it are listed too (links_out)")
    described.add_argument("--tree", help="a folder among --scan's that resolves into this tree (the project, which "
                           "a container has at this path) lists the links that leave the tree instead")
    described.add_argument("--mounted", action="append", default=[], help="a place the container has mounted from "
                           "the same host path (a data mount): TARGET; a link to a place under TARGET is not listed "
                           "where the container resolves it within its mounts")
    # Its own option, not --mounted nor a prefix of it (argparse takes abbreviations): an agent older than it, which
    # took a --mounted value for one path, refuses it.
    described.add_argument("--bind", action="append", dest="mounted", help="a place the container has mounted "
                           "from another host path (a -v): SOURCE:TARGET, as --mounted")
    described.add_argument("paths", nargs="*")
    described.set_defaults(func=cmd_describe_paths)
    with_env = sub.add_parser("exec-with-env")
    with_env.add_argument("file")
    with_env.add_argument("argv", nargs="+")
    with_env.set_defaults(func=cmd_exec_with_env)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
