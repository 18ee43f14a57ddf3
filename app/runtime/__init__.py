"""The ONNX Runtime side: sessions, pipelines, the inference call, tensors."""
