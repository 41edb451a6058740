"""``python -m proxymode_sandbox`` is the ``proxymode-sandbox`` command."""

import sys

from proxymode_sandbox.cli import main

sys.exit(main())
