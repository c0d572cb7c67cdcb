"""``python -m hydroagent_hpc.cli``: the ``hydroagent`` command."""

import sys

from hydroagent_hpc.cli import main

sys.exit(main())
