#!/usr/bin/python3
"""tools/digits.py OUT_DIR: the main job's data and its reference (tools/demo.sh runs it).

Splits the UCI handwritten digits as Debian's python3-sklearn ships them (1,797 images of 8x8 pixels,
0 to 16, and their digit) into OUT_DIR/train.csv and OUT_DIR/test.csv (a header line, 64 pixel columns,
the label last) with scikit-learn's usual fixed split (train_test_split, a quarter held out,
random_state=0), then trains the reference on the same split, scikit-learn's LogisticRegression on the
pixels / 16, and prints its held-out accuracy in the line format the demo prints its own.
"""
import gzip
import os
import sys

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

DIGITS = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: tools/digits.py OUT_DIR", file=sys.stderr)
        return 2
    out = sys.argv[1]
    with gzip.open(DIGITS, "rt") as f:
        data = np.loadtxt(f, delimiter=",", dtype=np.int64)
    x, y = data[:, :-1], data[:, -1]
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    os.makedirs(out, exist_ok=True)
    header = ",".join([f"pixel_{i}" for i in range(x.shape[1])] + ["label"])
    for name, xs, ys in (("train", x_train, y_train), ("test", x_test, y_test)):
        np.savetxt(os.path.join(out, name + ".csv"), np.column_stack([xs, ys]), fmt="%d", delimiter=",",
                   header=header, comments="")
    reference = LogisticRegression(max_iter=10000).fit(x_train / 16.0, y_train)
    accuracy = float((reference.predict(x_test / 16.0) == y_test).mean())
    print(f"digits: {len(y_train)} training and {len(y_test)} held-out images of 8x8 pixels "
          f"(UCI, from Debian's python3-sklearn)")
    print(f"reference, scikit-learn's LogisticRegression: held-out accuracy {100 * accuracy:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
