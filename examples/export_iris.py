"""Your own model: train a scikit-learn classifier on the iris data set and
export it to iris.onnx with skl2onnx, ready for `python manage.py models add
iris.onnx --name iris`. Without `zipmap`, the probabilities are a plain tensor
a job can return.

Install: pip install scikit-learn skl2onnx   (the service's .venv has both)
Reads: no variable. Writes: iris.onnx in the current directory.
"""

import numpy as np
from skl2onnx import to_onnx
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

x, y = load_iris(return_X_y=True)
model = LogisticRegression(max_iter=500).fit(x.astype(np.float32), y)
onx = to_onnx(model, x[:1].astype(np.float32), options={"zipmap": False})
with open("iris.onnx", "wb") as f:
    f.write(onx.SerializeToString())
print("wrote iris.onnx: input", onx.graph.input[0].name, "outputs",
      [output.name for output in onx.graph.output])  # fmt: skip
