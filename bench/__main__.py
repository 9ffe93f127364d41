"""`python -m tritonrnn.bench` runs the `tritonrnn` command."""

import sys

from .cli import main

sys.exit(main())
