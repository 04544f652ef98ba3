"""edgeinfer: low-latency ML inference on AWS IoT Greengrass v2.

The device side lives in one subpackage per Greengrass component (`runtime`, `model`, `installer`,
`telemetry`), the simulated core in `sim`, the cloud side in `edgeinfer_cloud`. The message contract
is `edgeinfer.messages`; all I/O goes through `edgeinfer.transport`.
"""

__version__ = "0.1.0"
