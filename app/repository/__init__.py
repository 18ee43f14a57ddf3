"""The model repository: the folder of cards and model files (`registry`), the load
states every process shares (`states`), bringing a model in (`intake`, checked with
ONNX Runtime), loading and unloading it (`control`, as Triton's repository API).
The bundled models' builders are a package of their own, `modelbuild`."""
