"""The corrupt-JPEG check (kaggle_utils.data.jpeg): what it finds, what it costs.

    python bench/jpeg_check_speed.py                 # ~5 minutes on 2 cores
    python bench/jpeg_check_speed.py --part speed --rounds 3

Three parts, all on scikit-image's photos resized to 512x512 (``--size``):

* detection: random 40-byte garbles, 40-byte zeroed runs and single bit flips in the entropy-coded
  segment (200 each, ``--samples``): how many libjpeg warns on (its own message on stderr, through
  OpenCV's decoder: the oracle), how many the check flags, and on how many files they disagree.
* clean: every scikit-image picture, encoded by PIL, TensorFlow, OpenCV and simplejpeg (baseline and
  progressive, 4:4:4 to 4:1:1, greyscale, CMYK, restart markers): how many the check flags (must be 0),
  and whether simplejpeg's pixels equal ``tf.io.decode_jpeg``'s (it decodes in the augmentation workers).
* speed: ``load_dataset`` decode-only (no augmentation, batch 32, repeated, shuffled) over TFRecords of
  distinct photos, interleaved round by round, median images/s: the check off (no simplejpeg), the check
  on every read (no memory of checked records: the first epoch), and the check on with the records
  already checked (every later epoch, and training after the job's label scan; the warm-up of the
  first round reads them all once). Also one image's decode
  in an augmentation worker, with simplejpeg and with OpenCV.
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PHOTOS = ("astronaut", "cat", "chelsea", "coffee", "hubble_deep_field", "immunohistochemistry", "retina", "rocket")


def photo(name: str, size: int):
    import numpy as np
    from PIL import Image
    from skimage import data

    image = getattr(data, name)()
    if image.dtype == bool:
        image = image.astype(np.uint8) * 255
    elif image.dtype != np.uint8:
        image = (np.clip(image, 0, 1) * 255).astype(np.uint8)
    image = np.stack([image] * 3, -1) if image.ndim == 2 else image[..., :3]
    return image if size is None else np.asarray(Image.fromarray(image).resize((size, size), Image.BILINEAR))


def pil_jpeg(image, mode="RGB", **options) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).convert(mode).save(buffer, "JPEG", **options)
    return buffer.getvalue()


class StderrText:
    """What C code writes to file descriptor 2 inside the block (libjpeg's warnings)."""

    def __enter__(self):
        sys.stderr.flush()
        self._file = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        self.text = self._file.read().decode(errors="replace")


def libjpeg_warns(data: bytes) -> bool:
    import cv2
    import numpy as np

    with StderrText() as err:
        cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    return "Corrupt JPEG data" in err.text or "Premature end" in err.text


def garble(data: bytes, rng, kind: str) -> bytes:
    scan = data.index(b"\xff\xda")
    start = scan + 2 + int.from_bytes(data[scan + 2:scan + 4], "big")
    out = bytearray(data)
    if kind == "bit flip":
        out[int(rng.integers(start, len(data) - 2))] ^= 1 << int(rng.integers(8))
        return bytes(out)
    at = int(rng.integers(start, len(data) - 42))
    out[at:at + 40] = rng.integers(0, 256, 40, dtype="uint8").tobytes() if kind == "random" else bytes(40)
    return bytes(out)


def detection(args) -> None:
    import numpy as np

    from kaggle_utils.data import jpeg

    clean = [pil_jpeg(photo(name, args.size), quality=90) for name in PHOTOS]
    print(f"\n| garble ({args.samples} files, {args.size}px, PIL q90 4:2:0) | libjpeg warns | check flags | disagree |")
    print("|---|---|---|---|")
    for kind in ("random", "zeroed", "bit flip"):
        rng = np.random.default_rng(0)
        warned = flagged = disagree = 0
        for k in range(args.samples):
            data = garble(clean[k % len(clean)], rng, kind)
            w, f = libjpeg_warns(data), bool(jpeg.jpeg_problem(data))
            warned, flagged, disagree = warned + w, flagged + f, disagree + (w != f)
        print(f"| {kind} | {warned} | {flagged} | {disagree} |")


def encodings(image):
    import cv2
    import numpy as np
    import simplejpeg
    import tensorflow as tf

    grey = image.mean(-1).astype(np.uint8)
    out = {}
    for quality in (75, 95):
        for sub in (0, 1, 2):
            out[f"pil q{quality} sub{sub}"] = pil_jpeg(image, quality=quality, subsampling=sub)
            out[f"pil q{quality} sub{sub} progressive"] = pil_jpeg(image, quality=quality, subsampling=sub,
                                                                   progressive=True)
        out[f"pil q{quality} optimized"] = pil_jpeg(image, quality=quality, optimize=True)
        out[f"pil q{quality} restart markers"] = pil_jpeg(image, quality=quality, restart_marker_blocks=4)
        out[f"tf q{quality}"] = tf.io.encode_jpeg(image, quality=quality).numpy()
        out[f"tf q{quality} progressive 4:4:4"] = tf.io.encode_jpeg(image, quality=quality, progressive=True,
                                                                    chroma_downsampling=False).numpy()
    out["pil grey"] = pil_jpeg(grey, quality=90)
    out["pil grey progressive"] = pil_jpeg(grey, quality=90, progressive=True)
    out["pil cmyk"] = pil_jpeg(image, "CMYK", quality=90)
    out["tf grey"] = tf.io.encode_jpeg(grey[..., None]).numpy()
    bgr = np.ascontiguousarray(image[..., ::-1])
    out["opencv restart markers"] = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_RST_INTERVAL, 2])[1].tobytes()
    out["opencv progressive"] = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1].tobytes()
    for sub in ("411", "440"):
        out[f"simplejpeg {sub}"] = simplejpeg.encode_jpeg(np.ascontiguousarray(image), colorsubsampling=sub)
    return out


def clean(args) -> None:
    import numpy as np
    import tensorflow as tf
    from skimage import data

    from kaggle_utils.data import jpeg

    names = [n for n in data.__all__ if n not in ("download_all", "data_dir", "lbp_frontal_face_cascade_filename")]
    files = flagged = warned = differ = 0
    for name in names:
        try:
            image = photo(name, None)
        except Exception:  # pictures that need a download, 3-D volumes, ...
            continue
        if image.ndim != 3 or min(image.shape[:2]) < 16:
            continue
        for label, encoded in encodings(image).items():
            files += 1
            flagged += bool(jpeg.jpeg_problem(encoded))
            warned += libjpeg_warns(encoded)
            out = np.zeros(image.shape, np.uint8)
            jpeg.decode_jpeg_into(encoded, out)
            differ += not np.array_equal(out, tf.io.decode_jpeg(encoded, channels=3, dct_method=jpeg.DCT_METHOD))
    print(f"\nclean files: {files}; flagged by the check: {flagged}; libjpeg warnings: {warned}; "
          f"worker decode != tf.io.decode_jpeg: {differ}")


def _forgetful():
    """Records remembered by nothing: every read is checked and guarded (a first epoch, for ever)."""
    from kaggle_utils.data import tensorflow_on_host, tfhost

    tf = tensorflow_on_host()

    class Forgetful(tfhost.RecordMemo):
        def known(self, key):
            return tf.constant(False)

    return Forgetful()


def speed(args) -> None:
    import numpy as np

    import kaggle_utils.data as kd
    from kaggle_utils.data import jpeg, tfhost
    from input_speed import measure  # this folder's: steady-state images/s of a fresh pipeline

    images = [np.roll(photo(name, args.size), 37 * k, axis=1) for k in range(args.images // len(PHOTOS))
              for name in PHOTOS]
    encoded = [pil_jpeg(image, quality=90) for image in images]
    print(f"\ncpus={os.cpu_count()} images={len(encoded)} ({sum(map(len, encoded)) / len(encoded) / 1024:.0f} kB "
          f"each) loadavg(start)={os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, kd.shard_name(0, args.size, len(encoded)))
        kd.write_tfrecord(path, [kd.serialize_example(data, label=0) for data in encoded])
        load = dict(image_size=args.size, batch_size=32, training=True, seed=0)
        saved = jpeg.strict_decoder, jpeg._notice_not_checked, tfhost._memo
        jpeg.strict_decoder, jpeg._notice_not_checked = (lambda: None), (lambda: None)
        datasets = {"check off (no simplejpeg)": kd.load_dataset(path, **load)}
        jpeg.strict_decoder, jpeg._notice_not_checked = saved[:2]
        tfhost._memo = _forgetful()  # the JPEG check's memory and the pipeline's (data/tfhost.py)
        datasets["check on, every read (first epoch)"] = kd.load_dataset(path, **load)
        tfhost._memo = saved[2]
        datasets["check on, records checked before"] = kd.load_dataset(path, **load)
        runs = {name: [] for name in datasets}
        for _ in range(args.rounds):
            for name, dataset in datasets.items():
                runs[name].append(measure(dataset, args.seconds, args.warmup_seconds))
    print(f"loadavg(end)={os.getloadavg()[0]:.2f}\n")
    off = runs["check off (no simplejpeg)"]
    print(f"| tf.data decode-only, {args.size}px | images/s (median) | runs | x check off (median of per-round) |")
    print("|---|---|---|---|")
    for name, values in runs.items():
        ratio = statistics.median(v / o for v, o in zip(values, off))
        print(f"| {name} | {statistics.median(values):.0f} | {' '.join(f'{v:.0f}' for v in values)} | {ratio:.2f} |")

    out = np.zeros((args.size, args.size, 3), np.uint8)
    timings = {}
    for label, decoder in (("simplejpeg, strict", saved[0]), ("OpenCV (without simplejpeg)", None)):
        jpeg._decoders["simplejpeg"] = decoder
        best = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            for data in encoded:
                jpeg.decode_jpeg_into(data, out)
            best.append((time.perf_counter() - start) / len(encoded) * 1e3)
        timings[label] = min(best)
    jpeg._decoders["simplejpeg"] = saved[0]
    print("\n| augmentation worker, one image | ms (best round) |\n|---|---|")
    for label, ms in timings.items():
        print(f"| {label} | {ms:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("all", "detection", "clean", "speed"), default="all")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--samples", type=int, default=200, help="garbled files per kind")
    parser.add_argument("--images", type=int, default=128, help="distinct images in the TFRecord (speed)")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup-seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for part, run in (("detection", detection), ("clean", clean), ("speed", speed)):
        if args.part in ("all", part):
            run(args)


if __name__ == "__main__":
    main()
