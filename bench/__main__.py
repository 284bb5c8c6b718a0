"""`python -m bench [--quick]`: the whole benchmark (see `bench.run`)."""

import sys

from bench.run import main

sys.exit(main())
