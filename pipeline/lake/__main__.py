"""`python -m tidewire.pipeline.lake --data-dir DIR | --store URL --lake DIR [--once]`: the lake bridge as its own
process."""

import sys

from tidewire.pipeline.lake.command import main

if __name__ == "__main__":
    sys.exit(main())
