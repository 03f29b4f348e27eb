"""Writes small TFRecord files of tf.train.Example images with TensorFlow.

Called by make_tf_reference.sh inside a virtual environment that has
tensorflow-cpu. Writes into the directory given as the only argument:

  rgb_png.tfrecord.gz    GZIP, 8 examples of 8x8 RGB PNG
  rgb_jpeg.tfrecord.gz   GZIP, 8 examples of 8x8 RGB JPEG
  gray_mixed.tfrecord    uncompressed, 8 examples of 8x8 grayscale, PNG and
                         JPEG alternating
  expected.txt           per example: file, index, label, format, height,
                         width, channels and every pixel as TensorFlow decodes
                         it (JPEG with dct_method INTEGER_ACCURATE, libjpeg's
                         default), row-major HWC

Each example follows TensorFlow's image conventions: "image/encoded" (bytes),
"image/format" (b"png" or b"jpeg") and "image/class/label" (int64). The label
is 1 for a bright image and 0 for a dark one, so a model can learn it whether
or not the image is cropped or flipped.
"""

import os
import sys

import numpy as np
import tensorflow as tf

SIZE = 8
PER_FILE = 8


def image(index, channels):
    """A deterministic 8x8 image with structure: a gradient, a bright corner
    block and a label-dependent brightness."""
    rng = np.random.default_rng(1000 + index)
    label = index % 2
    base = 150 if label else 60
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    img = np.zeros((SIZE, SIZE, channels), dtype=np.int32)
    for c in range(channels):
        img[:, :, c] = base + 6 * x - 3 * y + 20 * c
    img[0:3, 0:2, :] += 60  # Left-right asymmetric, so a flip shows.
    img += rng.integers(-10, 11, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8), label


def encode(pixels, fmt):
    if fmt == "png":
        return tf.io.encode_png(pixels).numpy()
    return tf.io.encode_jpeg(pixels, quality=90, chroma_downsampling=False).numpy()


def decode(encoded, fmt):
    if fmt == "png":
        return tf.io.decode_png(encoded, channels=0).numpy()
    return tf.io.decode_jpeg(encoded, channels=0, dct_method="INTEGER_ACCURATE").numpy()


def example(encoded, fmt, label):
    feature = {
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
        "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(value=[fmt.encode()])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def main(out_dir):
    files = [
        ("rgb_png.tfrecord.gz", "GZIP", 3, lambda i: "png"),
        ("rgb_jpeg.tfrecord.gz", "GZIP", 3, lambda i: "jpeg"),
        ("gray_mixed.tfrecord", "", 1, lambda i: "png" if i % 2 == 0 else "jpeg"),
    ]
    lines = ["# file index label format height width channels pixels... (TensorFlow "
             + tf.__version__ + ")"]
    seed = 0
    for name, compression, channels, fmt_of in files:
        options = tf.io.TFRecordOptions(compression_type=compression)
        with tf.io.TFRecordWriter(os.path.join(out_dir, name), options) as writer:
            for i in range(PER_FILE):
                fmt = fmt_of(i)
                pixels, label = image(seed, channels)
                seed += 1
                encoded = encode(pixels, fmt)
                writer.write(example(encoded, fmt, label))
                decoded = decode(encoded, fmt)
                h, w, c = decoded.shape
                values = " ".join(str(v) for v in decoded.reshape(-1))
                lines.append(f"{name} {i} {label} {fmt} {h} {w} {c} {values}")
    with open(os.path.join(out_dir, "expected.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
