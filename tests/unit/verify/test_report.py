"""The node verification's result parser and verdict, per mode pair (issue 11).

The inputs are what the node's tools print: ``iptables-save -t nat``, ``nft list chains``,
``ip -o link show`` and kube-proxy's ``/metrics``, in the shapes the real tools give.
"""

from __future__ import annotations

import json

import pytest

from proxymode.verify import NodeReading, ProbeOutcome, judge, parse_report, read_rules
from proxymode.verify.parse import has_device, iptables_counts, nft_counts, parse_metrics
from proxymode.verify.report import MAX_MESSAGE

METRICS_SYNCED = """\
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.7e+09
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7000000032e+09
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.001"} 0
"""
METRICS_NOT_SYNCED = (
    "process_start_time_seconds 1.7e+09\nkubeproxy_sync_proxy_rules_last_timestamp_seconds 0\n"
)


def _nat(svc: int, services_chain: bool = True) -> str:
    lines = ["*nat", ":PREROUTING ACCEPT [0:0]"]
    if services_chain:
        lines.append(":KUBE-SERVICES - [0:0]")
    lines += [f":KUBE-SVC-{i:016X} - [0:0]" for i in range(svc)]
    lines += [f"-A KUBE-SERVICES -d 10.96.0.{i}/32 -j KUBE-SVC-{i:016X}" for i in range(svc)]
    return "\n".join([*lines, "COMMIT", ""])


def _chains(services: int, families: tuple[str, ...] = ("ip",)) -> str:
    out = ["table inet filter {", "\tchain input {", "\t}", "}"]
    for family in families:
        out.append(f"table {family} kube-proxy {{")
        out += ["\tchain services {", "\t}", "\tchain masquerading {", "\t}"]
        for i in range(services):
            out += [f"\tchain service-ABC{i:04d}-sandbox/svc-{i:05d}/tcp/http {{", "\t}"]
        out.append("}")
    return "\n".join(out) + "\n"


CLEAN_NFT = (_nat(0), _chains(3), "1: lo: <LOOPBACK,UP> mtu 65536\n")
LINKS = "1: lo: <LOOPBACK,UP> mtu 65536\n2: eth0@if7: <BROADCAST,UP> mtu 1500\n"
LINKS_IPVS = LINKS + "3: kube-ipvs0: <BROADCAST,NOARP> mtu 1500 qdisc noop\n"
OK_PROBE = ProbeOutcome("default/kubernetes:443", "10.96.0.1:443", ok=True, millis=4.2)
TIMEOUT_PROBE = ProbeOutcome("default/kubernetes:443", "10.96.0.1:443", error="timed out after 1s")


def _reading(nat: str, chains: str, links: str, mode: str, probe: ProbeOutcome | None = OK_PROBE,
             metrics: str = METRICS_SYNCED) -> NodeReading:  # fmt: skip
    reading = read_rules(nat, chains, links, metrics, mode + "\n")
    return NodeReading(**{**reading.__dict__, "probe": probe})


def test_the_parsers_read_what_the_tools_print() -> None:
    assert iptables_counts(_nat(3)) == (3, True)
    assert iptables_counts("*nat\nCOMMIT\n") == (0, False)
    assert nft_counts(_chains(1001)) == (("ip",), 1001)
    assert nft_counts(_chains(2, ("ip", "ip6"))) == (("ip", "ip6"), 4)
    assert nft_counts("table inet filter {\n\tchain service-x {\n\t}\n}\n") == ((), 0)
    assert has_device(LINKS_IPVS) and not has_device(LINKS)
    values = parse_metrics(METRICS_SYNCED)
    assert values["process_start_time_seconds"] == 1.7e9
    # v1.37 on a dual-stack node labels the sync gauge by family: the oldest one counts
    dual = parse_metrics(
        "process_start_time_seconds 1.79613016515e+09\n"
        'kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7961302212e+09\n'
        'kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1.7961301715e+09\n'
    )
    assert dual["kubeproxy_sync_proxy_rules_last_timestamp_seconds"] == 1.7961301715e9
    v4 = 'kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 205\n'
    only_v4 = read_rules(*CLEAN_NFT, v4 + "process_start_time_seconds 200\n", "nftables")
    assert only_v4.synced_after_start and only_v4.first_sync_seconds == 5


# (target, previous, nat, chains, links): a clean node after each move.
CLEAN = {
    ("nftables", "iptables"): (_nat(0, services_chain=True), _chains(1001), LINKS),
    ("nftables", "ipvs"): (_nat(0), _chains(12), LINKS),
    ("iptables", "nftables"): (_nat(101), _chains(0, ()), LINKS),
    ("iptables", "ipvs"): (_nat(101), "", LINKS),
    ("ipvs", "iptables"): (_nat(0), "", LINKS_IPVS),
    ("ipvs", "nftables"): (_nat(0), "", LINKS_IPVS),
    ("nftables", "nftables"): (_nat(0), _chains(5), LINKS),  # a hand-back
}


@pytest.mark.parametrize(("target", "previous"), sorted(CLEAN))
def test_a_clean_node_is_verified_in_every_mode_pair(target: str, previous: str) -> None:
    nat, chains, links = CLEAN[(target, previous)]
    report = judge(_reading(nat, chains, links, target), "general-2", target, previous, 3.5)
    assert report.ok, report.problems
    assert report.first_sync_seconds == pytest.approx(3.2)
    assert "first sync 3.2 s after start" in report.summary
    assert "kubernetes:443 reachable in 4 ms" in report.summary
    if target == "nftables":
        assert "nftables table with" in report.summary
        assert "0 iptables KUBE-SVC chains" in report.summary
    assert parse_report(report.message()) == report


# (target, previous, nat, chains, links, what the problem says)
LEFTOVERS = [
    ("nftables", "iptables", _nat(3), _chains(10), LINKS, "3 iptables KUBE-SVC chains left"),
    ("nftables", "ipvs", _nat(0), _chains(10), LINKS_IPVS, "1 ipvs kube-ipvs0 device left"),
    ("iptables", "nftables", _nat(5), _chains(5), LINKS, "1 nftables kube-proxy tables left"),
    ("iptables", "ipvs", _nat(5), "", LINKS_IPVS, "1 ipvs kube-ipvs0 device left"),
    ("ipvs", "iptables", _nat(7), "", LINKS_IPVS, "7 iptables KUBE-SVC chains left"),
    ("ipvs", "nftables", _nat(0), _chains(2, ("ip", "ip6")), LINKS_IPVS,
     "2 nftables kube-proxy tables left"),
]  # fmt: skip


@pytest.mark.parametrize(("target", "previous", "nat", "chains", "links", "said"), LEFTOVERS)
def test_the_old_modes_leftovers_fail_verification(
    target: str, previous: str, nat: str, chains: str, links: str, said: str
) -> None:
    report = judge(_reading(nat, chains, links, target), "general-2", target, previous)
    assert not report.ok
    assert said in report.problems
    assert said in report.summary
    assert sum(report.leftovers.values()) >= 1


@pytest.mark.parametrize(
    ("target", "nat", "chains", "links", "said"),
    [
        ("nftables", _nat(0), "", LINKS, "table ip kube-proxy is missing"),
        ("iptables", "*nat\nCOMMIT\n", "", LINKS, "the nat chain KUBE-SERVICES is missing"),
        ("ipvs", _nat(0), "", LINKS, "the kube-ipvs0 device is missing"),
    ],
)
def test_the_new_modes_structures_must_be_present(
    target: str, nat: str, chains: str, links: str, said: str
) -> None:
    report = judge(_reading(nat, chains, links, target), "n", target, "iptables")
    assert not report.ok and said in report.problems


def test_no_sync_since_start_a_wrong_mode_or_a_silent_proxy_fail() -> None:
    nat, chains, links = CLEAN[("nftables", "iptables")]
    unsynced = _reading(nat, chains, links, "nftables", metrics=METRICS_NOT_SYNCED)
    report = judge(unsynced, "n", "nftables", "iptables")
    assert "kube-proxy has not completed a full sync since it started" in report.problems
    wrong = judge(_reading(nat, chains, links, "iptables"), "n", "nftables", "iptables")
    assert "kube-proxy runs in mode iptables, not nftables" in wrong.problems
    silent = read_rules(nat, chains, links, "", None)
    report = judge(NodeReading(**{**silent.__dict__, "probe": OK_PROBE}), "n", "nftables", "x")
    assert "kube-proxy's metrics endpoint did not answer" in report.problems
    # A sync older than the process (the previous kube-proxy's) is not this one's.
    old = _reading(nat, chains, links, "nftables",
                   metrics="process_start_time_seconds 200\n"
                   "kubeproxy_sync_proxy_rules_last_timestamp_seconds 150\n")  # fmt: skip
    assert not old.synced_after_start


def test_a_service_that_times_out_fails_and_is_named() -> None:
    nat, chains, links = CLEAN[("nftables", "iptables")]
    report = judge(_reading(nat, chains, links, "nftables", TIMEOUT_PROBE), "general-2",
                   "nftables", "iptables")  # fmt: skip
    assert not report.ok
    assert report.problems == ("default/kubernetes:443 timed out after 1s",)
    leftovers = judge(_reading(_nat(3), chains, links, "nftables", TIMEOUT_PROBE), "general-2",
                      "nftables", "iptables")  # fmt: skip
    assert leftovers.summary == (
        "3 iptables KUBE-SVC chains left; default/kubernetes:443 timed out after 1s"
    )
    unprobed = judge(_reading(nat, chains, links, "nftables", None), "n", "nftables", "iptables")
    assert "no Service was probed" in unprobed.problems


def test_missing_tools_are_said_not_guessed() -> None:
    clean = _reading(*CLEAN[("nftables", "iptables")], "nftables")
    missing = ("nft is not installed in the verification image",)
    reading = NodeReading(**{**clean.__dict__, "errors": missing})
    report = judge(reading, "n", "nftables", "iptables")
    assert not report.ok and "nft is not installed in the verification image" in report.problems


def test_the_message_fits_the_kubelets_limit_and_foreign_text_is_not_a_report() -> None:
    nat, chains, links = CLEAN[("nftables", "iptables")]
    reading = _reading(nat, chains, links, "nftables", TIMEOUT_PROBE)
    many = NodeReading(**{**reading.__dict__, "errors": tuple(f"e{i}" * 40 for i in range(200))})
    message = judge(many, "n", "nftables", "iptables").message()
    assert len(message.encode()) <= MAX_MESSAGE
    assert parse_report(message) is not None
    assert parse_report("") is None
    assert parse_report("Error: exec failed") is None
    assert parse_report(json.dumps({"v": 99, "ok": True})) is None
