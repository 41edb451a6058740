"""Which context a kubeconfig names, by kubectl's rule rather than the Python client's.

With several files in ``$KUBECONFIG``, kubectl takes ``current-context`` from the first file
that sets it; the kubernetes Python client (37.x, ``KubeConfigMerger``) lets the last one
win. The plugin and the operator would then talk to another cluster than the ``kubectl``
beside them, which for ``abort``, ``promote`` or a migration is the wrong cluster. Passing
the context kubectl would use, by name, makes the two agree.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml


def kubectl_context(kubeconfig: str | None = None) -> str | None:
    """The ``current-context`` kubectl would use for these files (``kubeconfig`` or
    ``$KUBECONFIG``, separated as the platform separates paths), or None when no file sets
    one, when there is one file only (nothing to disagree on), or a file cannot be read
    (the client then says what is wrong with it)."""
    spec = kubeconfig if kubeconfig is not None else os.environ.get("KUBECONFIG", "")
    paths = [p for p in spec.split(os.pathsep) if p]
    if len(paths) < 2:
        return None
    for path in paths:
        try:
            with Path(path).expanduser().open(encoding="utf-8") as f:
                loaded = yaml.safe_load(f)
        except FileNotFoundError:
            continue  # kubectl skips a listed file that does not exist
        except (OSError, yaml.YAMLError):
            return None
        if isinstance(loaded, dict) and loaded.get("current-context"):
            return str(loaded["current-context"])
    return None
