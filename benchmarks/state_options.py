"""Ways to keep TTT's accumulated state S in 8 bits, measured against each other on one model.

The code is `lab/state_options.py` (run here, imported by other scripts and the lab's tests); `--help` lists the options.
"""

import sys

from lab.state_options import main

if __name__ == "__main__":
    sys.exit(main())
