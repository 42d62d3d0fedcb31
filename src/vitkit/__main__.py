import sys

from vitkit.cli import main

sys.exit(main())
