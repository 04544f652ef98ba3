"""`python -m edgeinfer.installer`: the Install lifecycle step of com.edgeinfer.RuntimeInstaller.

Runs on the system Python (standard library only), usually straight from the shipped wheel:

    PYTHONPATH={artifacts:path}/edgeinfer-<v>-py3-none-any.whl python3 -m edgeinfer.installer \\
        --work {work:path} --artifacts {artifacts:path} --unpacked {artifacts:decompressedPath} \\
        -o existingVenv='{configuration:/existingVenv}' -o allowList='{configuration:/allowList}' ...

Exit 0 when the environment is ready (installed, linked or unchanged); otherwise one line on stderr
and exit 2, so Greengrass marks the component ERRORED, and the device is left as it was.
"""

from __future__ import annotations

import sys

from edgeinfer.installer.preflight import check_running_interpreter

# First, and with nothing imported that an old interpreter could choke on: Python < 3.10 gets one
# line naming the interpreter to set or the package to install.
_refusal = check_running_interpreter()
if _refusal is not None:
    print(f"edgeinfer.installer: error: {_refusal}", file=sys.stderr)
    sys.exit(2)

from edgeinfer.installer.main import main  # noqa: E402

sys.exit(main())
