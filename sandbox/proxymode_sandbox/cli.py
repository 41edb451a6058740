"""``proxymode-sandbox``: the command behind ``make sandbox``, ``make sandbox-down`` and the demo.

    proxymode-sandbox up [--nodes N] [--canary N] [--legacy N] [--real N] [--services N]
                         [--containers-conf PATH]   # pods of local images under podman
    proxymode-sandbox down
    proxymode-sandbox status
    proxymode-sandbox show            # nodes by pool and the kube-proxy pod on each
    proxymode-sandbox demo [--scenario migrate|rollback]
                                      # a migration by the operator, gated on metrics, live
    proxymode-sandbox node add POOL | node remove NAME
    proxymode-sandbox crashloop NAMESPACE POD [--off]
    proxymode-sandbox exec NODE -- CMD...   # in a real node's namespace: iptables-save,
                                      # nft list ruleset, curl http://10.96.0.80
    proxymode-sandbox reset-kube-proxy   # kube-system's kube-proxy as `up` installed it
                                      # (after a finalized example, before the next)
    proxymode-sandbox operator start|stop [--for-kubeconfig PATH]
                                      # the operator `up` starts (logs/operator.log);
                                      # `make run` stops it first to take over

The state directory is ``.sandbox`` unless ``--dir`` or ``PROXYMODE_SANDBOX`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from proxymode_sandbox import demo
from proxymode_sandbox.cluster import DEFAULT_STATE_DIR, Sandbox, SandboxConfig, SandboxError
from proxymode_sandbox.show import render_cluster


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="proxymode-sandbox",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("PROXYMODE_SANDBOX", DEFAULT_STATE_DIR)),
        help="state directory (default: .sandbox)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the control plane, nodes and kube-proxy")
    up.add_argument("--nodes", type=int, default=6)
    up.add_argument("--canary", type=int, default=2, help="nodes in the canary pool")
    up.add_argument(
        "--legacy",
        type=int,
        default=0,
        help="nodes in a pool with a kernel older than 5.13 (RHEL 8)",
    )
    up.add_argument(
        "--proxy-mode", default="iptables", choices=["iptables", "ipvs", "nftables", ""]
    )
    up.add_argument(
        "--real",
        type=int,
        default=3,
        help="nodes that are real (network namespaces running kube-proxy); 0: kwok only",
    )
    up.add_argument(
        "--services", type=int, default=100, help="Services besides echo, for real sync cost"
    )
    up.add_argument(
        "--containers-conf",
        default="",
        metavar="PATH",
        help="run real nodes' pods whose image is in the local podman store under podman,"
        " with this containers.conf (`make image` writes ~/.cache/proxymode/image/"
        "containers.conf); default: every pod is a process",
    )
    sub.add_parser("down", help="stop every sandbox process and remove the state")
    sub.add_parser("status", help="report which components run")
    sub.add_parser("show", help="nodes by pool and the kube-proxy pod on each")
    demo_cmd = sub.add_parser("demo", help="run an iptables -> nftables migration, shown live")
    demo_cmd.add_argument(
        "--scenario",
        choices=demo.SCENARIOS,
        default="migrate",
        help="migrate: healthy, to Completed; rollback: slow-sync on a canary, rolled back",
    )
    node = sub.add_parser("node", help="add or remove a node while the sandbox runs")
    node_sub = node.add_subparsers(dest="action", required=True)
    node_sub.add_parser("add").add_argument("pool")
    node_sub.add_parser("remove").add_argument("name")
    crash = sub.add_parser("crashloop", help="make a pod crash-loop (or stop, with --off)")
    crash.add_argument("namespace")
    crash.add_argument("pod")
    crash.add_argument("--off", action="store_true")
    sub.add_parser("reset-kube-proxy", help="kube-system's kube-proxy back to what `up` installed")
    op = sub.add_parser("operator", help="start or stop the sandbox's own operator")
    op.add_argument("action", choices=["start", "stop"])
    op.add_argument(
        "--for-kubeconfig",
        default=None,
        help="stop only when this kubeconfig is the sandbox's (what `make run` passes)",
    )
    run = sub.add_parser("exec", help="run a command in a real node's network namespace")
    run.add_argument("node")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = SandboxConfig(state_dir=args.dir)
    if args.command == "up":
        config.nodes, config.canary_nodes, config.legacy_nodes = (
            args.nodes,
            args.canary,
            args.legacy,
        )
        config.proxy_mode = args.proxy_mode
        config.real_nodes, config.services = args.real, args.services
        config.containers_conf = args.containers_conf
    sandbox = Sandbox(config)
    try:
        return _run(sandbox, args)
    except SandboxError as e:
        print(f"proxymode-sandbox: {e}", file=sys.stderr)
        return 1


def _run(sandbox: Sandbox, args: argparse.Namespace) -> int:
    if args.command == "up":
        return _up(sandbox)
    if args.command == "down":
        stopped = sandbox.down()
        print(
            f"sandbox down: stopped {', '.join(stopped) if stopped else 'nothing (none running)'}"
        )
        return 0
    if args.command == "status":
        return _status(sandbox)
    if args.command == "operator" and args.action == "stop":
        return _stop_operator(sandbox, args.for_kubeconfig)
    if not sandbox.status().healthy:
        print(f"no healthy sandbox in {sandbox.dir}; run `make sandbox`", file=sys.stderr)
        return 1
    return _use(sandbox, args)


def _up(sandbox: Sandbox) -> int:
    if sandbox.status().healthy:
        print(f"sandbox already running in {sandbox.dir} ({sandbox.server})")
        if sandbox.operator_record() is None:
            _start_operator(sandbox)
        return 0
    start = time.monotonic()
    sandbox.up(log=lambda line: print(f"  {line}", flush=True))
    sandbox.install_crd()
    _start_operator(sandbox)
    if sandbox.real_node_names():
        print(f"  real nodes: {', '.join(sandbox.real_node_names())} (`exec NODE -- CMD`)")
    print(
        f"sandbox up in {time.monotonic() - start:.1f}s: Kubernetes "
        f"{sandbox.kubernetes_version} at {sandbox.server}"
    )
    print(f"  source {sandbox.env_file} to use kubectl and helm against it")
    return 0


def _start_operator(sandbox: Sandbox) -> None:
    """The operator, as if installed: `kubectl apply -f examples/...` works next."""
    running = sandbox.operator_record()
    if running is not None:
        print(f"  stopping the running operator (pid {running.pid}) to start a fresh one")
    record = sandbox.start_operator()
    print(f"  operator running (pid {record.pid}, log {record.log}); `make run` replaces it")


def _stop_operator(sandbox: Sandbox, for_kubeconfig: str | None) -> int:
    """Stop the sandbox's operator (``make run`` calls this before it starts its own)."""
    if for_kubeconfig is not None:
        # $KUBECONFIG may be a list (kubectl merges it): any entry naming the sandbox's
        # kubeconfig means `make run` would act on the sandbox's policies too.
        paths = [p for p in (for_kubeconfig or "~/.kube/config").split(os.pathsep) if p]
        wanted = {Path(p).expanduser().resolve() for p in paths}
        if sandbox.kubeconfig.resolve() not in wanted:
            return 0  # another cluster: the sandbox's operator is not in the way
    record = sandbox.operator_record()
    if record is None:
        return 0
    sandbox.stop_operator()
    print(
        f"stopped the sandbox's operator (pid {record.pid}) so that this one drives the"
        " policies; `proxymode-sandbox operator start` brings it back"
    )
    return 0


def _use(sandbox: Sandbox, args: argparse.Namespace) -> int:
    if args.command == "show":
        print(render_cluster(sandbox))
    elif args.command == "demo":
        phase = demo.run(sandbox, out=lambda line: print(line, flush=True), scenario=args.scenario)
        return 0 if phase == demo.expected_phase(args.scenario) else 1
    elif args.command == "node" and args.action == "add":
        print(f"node {sandbox.add_node(args.pool)} added and Ready")
    elif args.command == "node":
        sandbox.remove_node(args.name)
        print(f"node {args.name} removed")
    elif args.command == "exec":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not argv:
            print("usage: proxymode-sandbox exec NODE -- CMD...", file=sys.stderr)
            return 2
        proc = sandbox.exec(args.node, argv, timeout=600)
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr)
        return proc.returncode
    elif args.command == "operator":
        _start_operator(sandbox)
    elif args.command == "reset-kube-proxy":
        sandbox.reset_kube_proxy()
        print("kube-system/kube-proxy is as `up` installed it, every pod restarted")
    elif args.command == "crashloop":
        sandbox.set_crashloop(args.namespace, args.pod, on=not args.off)
    return 0


def _status(sandbox: Sandbox) -> int:
    st = sandbox.status()
    if not st.exists:
        print(f"no sandbox in {st.state_dir}")
        return 1
    print(f"sandbox {st.state_dir}: Kubernetes {st.kubernetes_version} at {st.server}")
    for c in st.components:
        print(f"  {c.name:<24} pid {c.pid:<8} {'running' if c.running else 'NOT RUNNING'}")
        if not c.running and c.name == "operator":
            print("    `proxymode-sandbox operator start` (or `make sandbox`) starts it again")
        if not c.running:
            print("    last lines of " + str(c.log) + ":")
            for line in c.log_tail.splitlines():
                print(f"      {line}")
    # Every process, the operator included: a script asking whether all runs gets "no"
    # when the operator died, though the cluster itself is usable (``healthy``).
    return 0 if st.healthy and all(c.running for c in st.components) else 1


if __name__ == "__main__":
    sys.exit(main())
