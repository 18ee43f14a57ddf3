"""Managing the model repository, as Triton's repository API: bring a model in
(checked with ONNX Runtime), load and unload versions for every process."""
