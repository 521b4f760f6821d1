import sys

from minieng.cli.main import main

sys.exit(main())
