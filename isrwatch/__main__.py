import sys

from isrwatch.cli import main

sys.exit(main())
