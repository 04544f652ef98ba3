"""edgeinfer_cloud: the hybrid router, publish and deploy to AWS, fleet telemetry, IoT policies."""
