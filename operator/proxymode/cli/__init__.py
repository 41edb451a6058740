"""``kubectl proxymode``: the kubectl plugin for ProxyModePolicies.

One module per command group (``status``, ``actions``, ``plan``, ``advise``, ``report``), a
thin API client (``client``), and pure modules that import no Kubernetes client and are unit
tested on plain data (``tree``, ``planning``, ``advice``, ``document``).
"""
