import sys

from minieng.cli.main import main

# Guarded: tensor-parallel workers are spawned processes, which import this module again.
if __name__ == "__main__":
    sys.exit(main())
