"""com.edgeinfer.InferenceRuntime: serves inference requests with dynamic batching on ONNX Runtime."""
