"""Capture: chosen requests with their results, spooled on disk and uploaded to S3 (docs/capture.md).

`hook.CaptureHook` sits in the runtime's answer layer and only selects (`samplers`) and hands over;
a writer thread makes the record (`record`) and puts it in the bounded on-disk `spool`; the
`uploader` thread sends the spool to S3 or an S3-compatible store (`s3`: SigV4 by the standard
library, credentials from the container-credentials chain, `credentials`), paced, each record under
one deterministic key.
"""
