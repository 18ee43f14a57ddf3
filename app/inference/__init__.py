"""Models: the repository on disk, input checks, ONNX Runtime sessions."""
