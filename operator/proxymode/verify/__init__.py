"""Node verification: what a node must show before its move counts as done (issue 11).

``parse`` reads what a node's own tools print (``iptables-save -t nat``, ``nft list
chains``, ``ip -o link``, kube-proxy's ``/metrics``); ``report`` judges one reading per
mode pair and carries the verdict as a short JSON termination message. Both are pure: the
operator's engine reads the same report the node's Job wrote. ``node`` is the Job's entry
point (``proxymode verify-node``), the only part with I/O.
"""

from proxymode.verify.parse import NodeReading, ProbeOutcome, parse_metrics, read_rules
from proxymode.verify.report import Report, judge, parse_report

__all__ = [
    "NodeReading",
    "ProbeOutcome",
    "Report",
    "judge",
    "parse_metrics",
    "parse_report",
    "read_rules",
]
