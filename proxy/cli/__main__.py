"""``python -m proxy.cli``: the ``dpproxy`` command."""

import sys

from proxy.cli.main import main

sys.exit(main())
