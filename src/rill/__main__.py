import sys

from rill.cli import main

sys.exit(main())
