"""The quality canary of `edgeinfer deploy --canary`: deploy to a canary thing group, watch its
telemetry windows against the rest of the fleet's, then promote to the target or roll the canaries back.

`compare` holds the judgement (pure: figures and thresholds in, a verdict with its reasons out),
`windows` what is watched (telemetry windows from MQTT or a recording), `flow` the AWS side.
"""
