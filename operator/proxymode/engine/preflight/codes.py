"""Preflight's finding codes (``status.preflight.findings[].code``). Stable: tools match them.

Which check of the chain (``proxymode.engine.preflight.CHAIN``) writes each, and at which
severity, is listed in the package docstring.
"""

from __future__ import annotations

from enum import StrEnum


class Code(StrEnum):
    # source: the kube-proxy to drive
    SOURCE_DAEMON_SET_MISSING = "SourceDaemonSetMissing"
    STATIC_POD_KUBE_PROXY = "StaticPodKubeProxy"
    EMBEDDED_KUBE_PROXY = "EmbeddedKubeProxy"
    DAEMON_SET_DOES_NOT_USE_CONFIG_MAP = "DaemonSetDoesNotUseConfigMap"
    SOURCE_CONFIG_MAP_MISSING = "SourceConfigMapMissing"
    CONFIG_KEY_MISSING = "ConfigKeyMissing"
    CONFIG_INVALID = "ConfigInvalid"
    CONFIG_FIELD_IGNORED = "ConfigFieldIgnored"
    # distributions
    MANAGED_ADDON = "ManagedAddon"
    KUBE_PROXY_FREE = "KubeProxyFree"
    # target: the mode and its config
    ALREADY_IN_TARGET_MODE = "AlreadyInTargetMode"
    MODE_UNSUPPORTED = "ModeUnsupported"
    MODE_DEPRECATED = "ModeDeprecated"
    FEATURE_GATE_ADDED = "FeatureGateAdded"
    CONFIG_OVERRIDES_INVALID = "ConfigOverridesInvalid"
    TARGET_CONFIG_INVALID = "TargetConfigInvalid"
    TARGET_CONFIG_NOTE = "TargetConfigNote"
    # nodes
    KERNEL_TOO_OLD = "KernelTooOld"
    KERNEL_UNKNOWN = "KernelUnknown"
    NO_ELIGIBLE_NODES = "NoEligibleNodes"
    STAGE_SELECTS_NOTHING = "StageSelectsNothing"
    PARTIAL_COVERAGE = "PartialCoverage"
    NODES_NOT_READY = "NodesNotReady"
    CONTROL_PLANE_LAST = "ControlPlaneLast"
    # metrics the checks need
    METRICS_NOT_SCRAPED = "MetricsNotScraped"
    METRIC_SERIES_MISSING = "MetricSeriesMissing"
    QUERY_INVALID = "QueryInvalid"
    # verification
    VERIFY_SERVICE_MISSING = "VerifyServiceMissing"
    # conflicts
    MANAGED_BY_GITOPS = "ManagedByGitOps"
    ANOTHER_POLICY_IN_FLIGHT = "AnotherPolicyInFlight"
    NODES_ALREADY_LABELLED = "NodesAlreadyLabelled"
