"""com.edgeinfer.RuntimeInstaller: detects the platform and installs exactly one ONNX Runtime."""
