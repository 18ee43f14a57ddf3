"""A batch from a Parquet file to a pandas DataFrame: write 300 digit images to
digits.parquet (a column `pixels`, one list of 64 values a row), run them as one
batch on the `digits` model, and read the results as a DataFrame in input order,
a column per output (`label`, `probabilities`).

Install: pip install "./inference_client[parquet]"   (from the repository root: pandas, pyarrow)
Reads: INFERENCE_URL (default http://127.0.0.1:8000) and INFERENCE_API_KEY.
Writes: digits.parquet in the current directory.
"""

import pandas as pd

from inference_client import Client

# Three 8x8 images, 64 pixel values from 0 (white) to 16 (black): a 0, a 1 and a 2.
IMAGES = [
    [0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0,
     0, 4, 12, 0, 0, 8, 8, 0, 0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0,
     0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0],
    [0, 0, 0, 12, 13, 5, 0, 0, 0, 0, 0, 11, 16, 9, 0, 0, 0, 0, 3, 15, 16, 6, 0, 0,
     0, 7, 15, 16, 16, 2, 0, 0, 0, 0, 1, 16, 16, 3, 0, 0, 0, 0, 1, 16, 16, 6, 0, 0,
     0, 0, 1, 16, 16, 6, 0, 0, 0, 0, 0, 11, 16, 10, 0, 0],
    [0, 0, 0, 4, 15, 12, 0, 0, 0, 0, 3, 16, 15, 14, 0, 0, 0, 0, 8, 13, 8, 16, 0, 0,
     0, 0, 1, 6, 15, 11, 0, 0, 0, 1, 8, 13, 15, 1, 0, 0, 0, 9, 16, 16, 5, 0, 0, 0,
     0, 3, 13, 16, 16, 11, 5, 0, 0, 0, 0, 3, 11, 16, 9, 0],
]  # fmt: skip

# 1. The input: a column per model input (`digits` has one, `pixels`), a row per image.
rows = pd.DataFrame({"pixels": [[float(v) for v in IMAGES[i % 3]] for i in range(300)]})
rows.to_parquet("digits.parquet")


with Client() as client:  # INFERENCE_URL and INFERENCE_API_KEY from the environment
    # 2. Upload the file, start the batch, follow it to its end (with progress bars
    #    on a terminal).
    results = client.batches.run("digits", "digits.parquet", timeout=300)
    print(f"batch {results.batch.id}: {results.batch.status}, {results.batch.rows_done} rows")
    # 3. The outputs in input order: a DataFrame with a column per output.
    frame = results.to_pandas()

print("shape:", frame.shape)
print("columns:", list(frame.columns))
print("first labels:", frame["label"].head(6).tolist())
print("labels counted:", frame["label"].value_counts().sort_index().to_dict())
