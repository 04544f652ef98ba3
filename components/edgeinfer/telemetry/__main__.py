"""`python -m edgeinfer.telemetry`: run the com.edgeinfer.Telemetry component (its recipe's Run step)."""

import sys

from edgeinfer.telemetry.component import main

if __name__ == "__main__":
    sys.exit(main())
